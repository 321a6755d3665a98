"""The acceptance scrape: every serving deployment's /metrics, concurrently, into the monitor store.

Given the deployments (their config), it also runs the acceptance guard after each scrape: a deployment
whose pooled live acceptance over its window fell under its `fallback_threshold` is relaunched with
speculation off, flagged `fallback`, and the team is alerted. vLLM has no acceptance threshold of its own.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from draftsync.serving.deployment import ServingDeployment
from draftsync.tasks import context
from draftsync.tasks.monitoring import scrape_deployment
from draftsync.tasks.serving import capture_config, configured_deployments

# Deployments scraped at once. Prefect's default runner starts a thread per task: 200 deployments held 200 threads
# asking the store for 200 connections at once (its pool has 15; SQLite takes one writer at a time). A scrape waits
# mostly on HTTP and the database, so a few threads cover a cycle: the scrapes of 200 endpoints take about 2 s on
# 2 cores (Prefect's task runs add their own cost on top; bench/reliability_load.py measures both).
SCRAPE_CONCURRENCY = 10


# Prefect types task_runner for futures in general, its ThreadPoolTaskRunner for its own futures' subclass
@flow(name="acceptance-scrape", task_runner=ThreadPoolTaskRunner(max_workers=SCRAPE_CONCURRENCY))  # type: ignore[arg-type]
def scrape(now: datetime | None = None, deployments: list[ServingDeployment] | None = None) -> dict:
    """`now` is the monitor's clock: production leaves it unset; the demo passes a compressed one.

    `deployments` None: the deployments file's (when there is one) give the guard its thresholds."""
    context.require_settings("acceptance-scrape", "registry", "store", "serving")
    now = now or datetime.now(UTC)
    specs = configured_deployments(deployments)
    deployments = list(specs.values())
    futures = []
    stopped = []
    for pair in context.store().pairs.all():
        if pair.state == "stopped":  # its servers were stopped on purpose: nothing to read until a rollout
            stopped.append({"deployment": pair.deployment, "skipped": "stopped"})
            continue
        spec = specs.get(pair.deployment)
        source: dict[str, Any] = (
            {"prometheus_url": spec.prometheus_url, "prometheus_labels": spec.prometheus_labels}
            if spec is not None and spec.prometheus_url
            else {}
        )
        capture = capture_config(spec) if spec is not None else None
        futures.append(scrape_deployment.submit(pair.deployment, now, capture=capture, **source))
    result = {"at": now.isoformat(), "deployments": [f.result() for f in futures] + stopped}
    if deployments:
        result["guard"] = [acceptance_guard(spec, now) for spec in deployments if spec.fallback_threshold is not None]
    return result


def acceptance_guard(spec: ServingDeployment, now: datetime) -> dict:
    """Fall back to plain decoding when live acceptance stays under the threshold over the window."""
    from draftsync.flows.rollout import rollout
    from draftsync.monitors.staleness import fallback_due
    from draftsync.tasks.alerts import send_alert

    store = context.store()
    pair = store.pairs.get(spec.name)
    if pair is None or pair.state != "serving" or pair.drafter_version is None:
        return {"deployment": spec.name, "action": "none", "reason": "not speculating"}
    window = timedelta(minutes=spec.fallback_window_minutes)
    samples = [
        s for s in store.acceptance.samples(spec.name, now - window, now) if s.drafter_version == pair.drafter_version
    ]
    assert spec.fallback_threshold is not None, "scrape guards only the deployments with a threshold"
    due, rate, draft_tokens = fallback_due(samples, spec.fallback_threshold, spec.fallback_min_draft_tokens)
    outcome = {
        "deployment": spec.name,
        "acceptance": rate,
        "draft_tokens": draft_tokens,
        "threshold": spec.fallback_threshold,
        "action": "none",
    }
    if not due:
        return outcome
    assert rate is not None, "a fallback is due only on a measured acceptance"
    reason = (
        f"live acceptance {rate:.3f} over the last {spec.fallback_window_minutes} min ({draft_tokens} draft "
        f"tokens) is under {spec.fallback_threshold}: speculation off"
    )
    rollout(spec, speculation=False, reason=reason)
    send_alert(
        spec.name,
        "acceptance-fallback",
        f"{spec.name} fell back to plain decoding (acceptance {rate:.2f})",
        f"{reason}.\nDrafter v{pair.drafter_version} for {pair.target_name} v{pair.target_version} is "
        f"mismatched or stale; the weekly review decides on a retrain.",
        value=rate,
        now=now,
    )
    return {**outcome, "action": "fallback"}
