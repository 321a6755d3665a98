"""The weekly acceptance review: trends and staleness per deployment, actions taken, one e-mail."""

from __future__ import annotations

from datetime import UTC, datetime

from prefect import flow, get_run_logger
from prefect.events import emit_event

from draftsync.flows.rollout import rollout
from draftsync.serving.deployment import ServingDeployment
from draftsync.tasks import context
from draftsync.tasks.monitoring import WEEK, review_deployment

STALE_EVENT = "draftsync.drafter.stale"


def _links(target_names: set[str]) -> dict[str, str]:
    settings = context.settings()
    links = {f"MLflow: {name}-drafter": f"http://127.0.0.1:5000/#/models/{name}-drafter" for name in sorted(target_names)}
    links["Prefect flow runs"] = "http://127.0.0.1:4200/runs"
    links["MLflow UI on this work dir"] = f"mlflow ui --backend-store-uri {settings.mlflow_tracking_uri}"
    return links


@flow(name="weekly-acceptance-report", log_prints=True)
def weekly_report(
    now: datetime | None = None, deployments: list[ServingDeployment] | None = None, notes: list[str] | None = None
) -> dict:
    """Review the last 7 days; stale drafters fall back to plain decoding and a retrain is requested."""
    from draftsync.monitors.mailer import Mailer
    from draftsync.monitors.report import build_weekly_report
    from draftsync.monitors.staleness import Thresholds

    logger = get_run_logger()
    now = now or datetime.now(UTC)
    store, settings = context.store(), context.settings()
    specs = {d.name: d for d in deployments or []}
    summaries, findings, actions, targets = [], [], {}, set()
    for pair in store.serving_pairs():
        review = review_deployment(pair.deployment, now)
        summaries.append(review["summary"])
        findings.extend(review["findings"])
        targets.add(pair.target_name)
        taken = []
        wanted = {f.action for f in review["findings"]}
        if any("fallback" in a for a in wanted) and pair.state == "serving" and pair.deployment in specs:
            rollout(specs[pair.deployment], speculation=False, reason="weekly review: acceptance below the fallback threshold")
            taken.append("fell back to plain decoding (speculation off)")
        if any(f.rule == "stale" for f in review["findings"]):
            current = store.serving_pair(pair.deployment)
            store.set_serving_pair(
                pair.deployment, target_name=current.target_name, target_version=current.target_version,
                drafter_name=current.drafter_name, drafter_version=current.drafter_version, gamma=current.gamma,
                endpoint=current.endpoint, state="stale", now=now,
            )
            taken.append("marked stale")
        if any("retrain" in a for a in wanted):
            emit_event(
                event=STALE_EVENT,
                resource={"prefect.resource.id": f"draftsync.deployment.{pair.deployment}"},
                payload={"target_name": pair.target_name, "target_version": pair.target_version},
            )
            taken.append(f"retrain requested (event {STALE_EVENT} for {pair.target_name} v{pair.target_version})")
        actions[pair.deployment] = taken or ["none"]
    thresholds = Thresholds.from_settings(settings)
    message = build_weekly_report(
        summaries, findings, actions, _links(targets), (now - WEEK, now), thresholds=thresholds, notes=notes or []
    )
    entry = Mailer(settings.outbox_dir, store, settings).send(message, now=now)
    for finding in findings:
        if finding.severity != "info" and store.should_alert(
            finding.key, now, finding.value, severity=finding.severity, higher_is_worse=finding.higher_is_worse
        ):
            store.record_alert(
                finding.key, deployment=finding.deployment, rule=finding.rule, severity=finding.severity,
                value=finding.value, sent_at=now, outbox_id=entry.id,
            )
    logger.info("weekly report %r written to %s", message["Subject"], entry.eml_path)
    return {
        "subject": message["Subject"],
        "eml_path": entry.eml_path,
        "status": entry.status,
        "findings": [
            {"deployment": f.deployment, "rule": f.rule, "severity": f.severity, "value": f.value, "message": f.message, "action": f.action}
            for f in findings
        ],
        "actions": actions,
        "summaries": {s.deployment: {"acceptance_rate": s.acceptance_rate, "daily": s.daily} for s in summaries},
    }
