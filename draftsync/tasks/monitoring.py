"""Monitoring steps: scrape a deployment's counters, summarise a week, decide, and send the report."""

from __future__ import annotations

from datetime import datetime, timedelta

from prefect import task
from prefect.cache_policies import NONE

from draftsync.tasks import context

WEEK = timedelta(days=7)


@task(name="scrape-deployment", retries=2, retry_delay_seconds=2, cache_policy=NONE)
def scrape_deployment(deployment: str, now: datetime) -> dict:
    """Read /metrics of the deployment's endpoint and store the delta since the previous scrape."""
    from draftsync.monitors.metrics import scrape_counters

    store = context.store()
    pair = store.serving_pair(deployment)
    counters = scrape_counters(f"{pair.endpoint}/metrics")
    sample = store.record_scrape(deployment, now, counters, pair, count_first=True)
    if sample is None:
        return {"deployment": deployment, "baseline": True}
    return {
        "deployment": deployment,
        "draft_tokens": sample.draft_tokens,
        "accepted": sample.accepted,
        "acceptance_rate": sample.accepted / sample.draft_tokens if sample.draft_tokens else None,
        "reset": sample.reset,
    }


@task(name="review-deployment", cache_policy=NONE)
def review_deployment(deployment: str, now: datetime) -> dict:
    """The week's summary and findings for one deployment, with its lineage checked in the registry."""
    from draftsync.monitors.staleness import Thresholds, evaluate
    from draftsync.monitors.trends import summarize
    from draftsync.tasks.registration import drafter_model_name

    store = context.store()
    pair = store.serving_pair(deployment)
    summary = summarize(store.samples(deployment, now - WEEK, now), now - WEEK, now, deployment=deployment)
    trained_for = None
    if pair is not None and pair.drafter_version is not None:
        tags = context.registry().version_tags(drafter_model_name(pair.target_name), pair.drafter_version)
        trained_for = int(tags["draftsync.target.version"])
    findings = evaluate(
        summary, pair.target_version if pair else None, trained_for, Thresholds.from_settings(context.settings())
    )
    return {"summary": summary, "findings": findings, "pair": pair}
