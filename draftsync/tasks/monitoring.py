"""Monitoring steps: scrape a deployment's counters, summarise a week, decide, and send the report."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from prefect import task
from prefect.cache_policies import NONE

from draftsync.tasks import context

if TYPE_CHECKING:
    from draftsync.monitors.predictions import PredictionCheck
    from draftsync.monitors.staleness import Baseline, Finding
    from draftsync.monitors.tables import PairInfo, ServingPair
    from draftsync.monitors.trends import DeploymentSummary
    from draftsync.serving.traffic_capture import CaptureConfig

WEEK = timedelta(days=7)
# How far back a pair's first served window is looked for: a pair older than this was judged by earlier reviews.
PREDICTION_LOOKBACK = 4 * WEEK


@dataclass(frozen=True)
class DeploymentReview:
    """One deployment's week as the weekly review judged it."""

    summary: DeploymentSummary  # the week of the pair serving now (or the one it fell back from)
    findings: list[Finding]
    pair: ServingPair | None  # what the deployment serves now (None: nothing recorded)
    judged: tuple[int, int | None] | None  # the (target version, drafter version) judged
    week_over_week: float | None  # the change in acceptance from the week before
    baseline: Baseline | None  # the drafter's first week, once that week is over
    replaced: list[dict]  # the week's other pairs, each with its own acceptance
    predictions: list[PredictionCheck]  # each drafted pair of the week (replaced ones first) against its prediction


@task(name="scrape-deployment", retries=2, retry_delay_seconds=2, cache_policy=NONE)
def scrape_deployment(
    deployment: str,
    now: datetime,
    prometheus_url: str | None = None,
    prometheus_labels: dict[str, str] | None = None,
    capture: CaptureConfig | None = None,
) -> dict:
    """Read the deployment's counters and store the delta since the previous scrape; with `capture` (its router's
    capture), book the requests captured since the previous scrape too (`book_captured_requests`).

    From its endpoint's /metrics, or, with `prometheus_url`, from that Prometheus server's HTTP API (the series
    matching `prometheus_labels`, e.g. {"job": "vllm-chat"}) for teams whose Prometheus already scrapes vLLM."""
    from draftsync.monitors.metrics import scrape_counters
    from draftsync.monitors.prometheus_api import query_counters

    store = context.store()
    pair = store.pairs.get(deployment)
    if prometheus_url:
        counters = query_counters(prometheus_url, prometheus_labels)
    else:
        counters = scrape_counters(f"{pair.endpoint}/metrics")
    sample = store.acceptance.record_scrape(deployment, now, counters, pair, count_first=True)
    booked = {"requests_booked": book_captured_requests(deployment, now, capture, pair)} if capture is not None else {}
    if sample is None:
        return {"deployment": deployment, "baseline": True, **booked}
    return {
        "deployment": deployment,
        **booked,
        "draft_tokens": sample.draft_tokens,
        "accepted": sample.accepted,
        "acceptance_rate": sample.accepted / sample.draft_tokens if sample.draft_tokens else None,
        "reset": sample.reset,
    }


def book_captured_requests(deployment: str, now: datetime, capture: CaptureConfig, pair: PairInfo) -> int:
    """Copy the acceptance of the requests the router captured since the last booking (never their prompts) into
    the monitor store, at the monitor's clock and to `pair`, the one serving now: per-domain and per-pair
    percentiles are read from there."""
    from draftsync.tasks.serving import captured_requests

    store = context.store()
    rows = captured_requests(capture, after_id=store.acceptance.captured_watermark(deployment))
    if not rows:
        return 0
    return store.acceptance.book_requests(deployment, now, pair, rows, last_row=rows[-1]["id"])


@task(name="review-deployment", cache_policy=NONE)
def review_deployment(deployment: str, now: datetime) -> DeploymentReview:
    """The week's summary and findings for one deployment, with its lineage checked in the registry."""
    from draftsync.monitors.staleness import Baseline, Thresholds, evaluate
    from draftsync.monitors.trends import summarize_hourly
    from draftsync.registry.model_registry import drafter_model_name

    store = context.store()
    pair = store.pairs.get(deployment)

    # Hourly rollups: a week is 168 rows per deployment however often it was scraped.
    this_week = store.acceptance.hourly(deployment, now - WEEK, now)
    judged = _judged_pair(pair, this_week)

    def served_now(row) -> bool:
        return judged is None or (row.target_version, row.drafter_version) == judged

    def week(start: datetime, drafter_version: int | None = None, rows: list | None = None):
        # only the pair serving now is judged, so the hours of a pair it replaced neither raise nor hide a finding
        rows = [
            r
            for r in (store.acceptance.hourly(deployment, start, start + WEEK) if rows is None else rows)
            if served_now(r)
        ]
        if drafter_version is not None:
            rows = [r for r in rows if r.drafter_version == drafter_version]
        return summarize_hourly(rows, start, start + WEEK, deployment=deployment)

    summary = week(now - WEEK, rows=this_week)
    previous = week(now - 2 * WEEK)
    replaced = _replaced_pairs(this_week, served_now, now, deployment)
    trained_for, baseline = None, None
    if pair is not None and pair.drafter_version is not None:
        from draftsync.registry.tags import trained_for_version

        drafter_name = drafter_model_name(pair.target_name)
        tags = context.registry().version_tags(drafter_name, pair.drafter_version)
        trained_for = trained_for_version(drafter_name, pair.drafter_version, tags)
        if pair.state == "serving" and pair.updated_at + WEEK <= now - WEEK:  # a first week that is over
            baseline = Baseline.from_summary(week(pair.updated_at, pair.drafter_version))
    findings = evaluate(
        summary,
        pair.target_version if pair else None,
        trained_for,
        Thresholds.from_settings(context.settings()),
        baseline=baseline,
    )
    pairs = [(r["target_version"], r["drafter_version"]) for r in replaced if r["drafter_version"] is not None]
    if judged is not None and judged[1] is not None:
        pairs.append(judged)
    predictions = prediction_checks(deployment, pairs, now)
    findings += [f for check in predictions if (f := check.finding(deployment)) is not None]
    change = (
        summary.acceptance_rate - previous.acceptance_rate
        if summary.acceptance_rate is not None and previous.acceptance_rate is not None
        else None
    )
    return DeploymentReview(summary, findings, pair, judged, change, baseline, replaced, predictions)


def prediction_checks(deployment: str, pairs: list[tuple[int, int]], now: datetime) -> list[PredictionCheck]:
    """Each (target version, drafter version) of `pairs` that `deployment` served: its first served window within
    PREDICTION_LOOKBACK against the prediction its drafter version's validation recorded."""
    from draftsync.errors import DraftsyncError
    from draftsync.monitors.predictions import check_prediction
    from draftsync.registry.model_registry import drafter_model_name
    from draftsync.registry.tags import PredictedAcceptance

    store, registry = context.store(), context.registry()
    pair = store.pairs.get(deployment)
    if pair is None or not pairs:
        return []
    rows = store.acceptance.hourly(deployment, now - PREDICTION_LOOKBACK, now)
    checks = []
    for target_version, drafter_version in pairs:
        try:
            tags = registry.version_tags(drafter_model_name(pair.target_name), drafter_version)
        except DraftsyncError:  # a version the registry no longer holds predicts nothing; the review goes on
            tags = {}
        predicted = PredictedAcceptance.from_tags(tags)
        checks.append(
            check_prediction(
                rows,
                target_version,
                drafter_version,
                None if predicted is None else (predicted.low, predicted.high),
                None if predicted is None else predicted.window_draft_tokens,
            )
        )
    return checks


def _judged_pair(pair, rows: list) -> tuple[int, int | None] | None:
    """The (target version, drafter version) a review judges: the pair serving now, or, while its speculation is off
    after a fallback, the drafter of the same target version it fell back from (its hours are why it is off)."""
    if pair is None:
        return None
    if pair.drafter_version is not None:
        return pair.target_version, pair.drafter_version
    drafted = [row for row in rows if row.target_version == pair.target_version and row.drafter_version is not None]
    return pair.target_version, (drafted[-1].drafter_version if drafted else None)


def _replaced_pairs(rows: list, served_now, now: datetime, deployment: str) -> list[dict]:
    """The week's other pairs of a deployment (those the serving one replaced), each with its own acceptance."""
    from draftsync.monitors.trends import summarize_hourly

    by_pair: dict[tuple[int, int | None], list] = {}
    for row in rows:
        if not served_now(row):
            by_pair.setdefault((row.target_version, row.drafter_version), []).append(row)
    out = []
    for (target_version, drafter_version), pair_rows in sorted(by_pair.items(), key=lambda item: item[1][-1].hour):
        summary = summarize_hourly(pair_rows, now - WEEK, now, deployment=deployment)
        out.append(
            {
                "target_version": target_version,
                "drafter_version": drafter_version,
                "acceptance_rate": summary.acceptance_rate,
                "draft_tokens": summary.draft_tokens,
                "last_hour": pair_rows[-1].hour.isoformat(),
            }
        )
    return out
