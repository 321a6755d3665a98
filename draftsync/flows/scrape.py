"""The acceptance scrape: every serving deployment's /metrics, concurrently, into the monitor store."""

from __future__ import annotations

from datetime import UTC, datetime

from prefect import flow

from draftsync.tasks import context
from draftsync.tasks.monitoring import scrape_deployment


@flow(name="acceptance-scrape")
def scrape(now: datetime | None = None) -> dict:
    """`now` is the monitor's clock: production leaves it unset; the demo passes a compressed one."""
    now = now or datetime.now(UTC)
    futures = [scrape_deployment.submit(pair.deployment, now) for pair in context.store().serving_pairs()]
    return {"at": now.isoformat(), "deployments": [f.result() for f in futures]}
