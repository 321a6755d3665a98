"""The weekly acceptance review: trends and staleness per deployment, actions taken, one e-mail.

The default review covers the last 7 days up to now and acts on what it finds: a deployment under the
fallback threshold is relaunched with speculation off (through rollout, for deployments declared in the
deployments file), a stale one is marked so, and a retrain is requested with an event the sync deployment
listens to. A retrain request, like an alert, is not repeated within a week unless the finding got worse.
A report on a past ISO week (`week="2026-W45"`) only looks back: it takes no action, since the deployments
may have changed since. With `send`, mail left pending by an earlier SMTP outage goes out first. With `act` False
(`draftsync report` without --act or --send) the review only reads: no action, no alert recorded, no e-mail.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from datetime import UTC, datetime

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from draftsync.errors import DraftsyncError
from draftsync.flows.rollout import rollout
from draftsync.serving.deployment import ServingDeployment
from draftsync.tasks import context, events, links
from draftsync.tasks.monitoring import WEEK, DeploymentReview, review_deployment
from draftsync.tasks.serving import configured_deployments
from draftsync.tasks.sync_requests import request_sync

ISO_WEEK = re.compile(r"^(\d{4})-W(\d{2})$")
NOT_SENT = (
    "not sent: delivery was not asked for (`draftsync report --send` delivers by SMTP); "
    "the e-mail is in the outbox folder only"
)


def iso_week_period(week: str, now: datetime | None = None) -> tuple[datetime, datetime]:
    """[Monday 00:00, next Monday 00:00) UTC of ISO week `YYYY-Www`; the week must have ended by `now`."""
    match = ISO_WEEK.match(week.strip())
    start = None
    if match:
        try:
            start = datetime.fromisocalendar(int(match[1]), int(match[2]), 1).replace(tzinfo=UTC)
        except ValueError:
            start = None
    if start is None:
        raise DraftsyncError(
            f"week {week!r} is not an ISO week of the calendar",
            "write it as YYYY-Www, e.g. 2026-W45 (weeks run 01..52, or 53 in long years)",
        )
    end = start + WEEK
    now = now or datetime.now(UTC)
    if end > now:
        raise DraftsyncError(
            f"week {week} has not ended yet (it ends {end:%Y-%m-%d %H:%M} UTC)",
            "leave --week out to review the last 7 days up to now, or pick a week that has ended",
        )
    return start, end


def _links(target_names: set[str]) -> dict[str, str]:
    settings = context.settings()
    links_by_name = {
        f"MLflow: {name}-drafter": links.model_version_url(f"{name}-drafter") for name in sorted(target_names)
    }
    links_by_name["Prefect flow runs"] = links.flow_run_url()
    if not settings.mlflow_tracking_uri.startswith(("http://", "https://")) and not settings.mlflow_ui_url:
        links_by_name["MLflow UI on this work dir"] = f"mlflow ui --backend-store-uri {settings.mlflow_tracking_uri}"
    return links_by_name


def _act(
    pair, review: DeploymentReview, specs: dict[str, ServingDeployment], fresh: set[str], now: datetime
) -> list[str]:
    """Fall back, mark stale and request a retrain as the findings say; returns what was done."""
    store, logger = context.store(), get_run_logger()
    findings = review.findings
    wanted = {f.action for f in findings}
    taken: list[str] = []
    if any("fallback" in a for a in wanted) and pair.state == "serving":
        spec = specs.get(pair.deployment)
        if spec is None:
            taken.append(
                f"fallback due, but {pair.deployment} is not in the deployments file "
                f"({context.settings().deployments_path}): not relaunched"
            )
        else:
            try:
                rollout(spec, speculation=False, reason="weekly review: acceptance below the fallback threshold")
                taken.append("fell back to plain decoding (speculation off)")
            except Exception as error:  # the e-mail must still go out and say what failed
                first_line = (str(error).strip().splitlines() or [""])[0]
                logger.error("fallback of %s failed: %s: %s", pair.deployment, type(error).__name__, first_line)
                taken.append(f"fallback FAILED ({type(error).__name__}: {first_line})")
    if any(f.rule == "stale" for f in findings) and pair.state != "stopped":
        current = store.pairs.get(pair.deployment)
        store.pairs.record(pair.deployment, current, endpoint=current.endpoint, state="stale", now=now)
        taken.append("marked stale")
    retrain = [f for f in findings if "retrain" in f.action]
    if retrain and any(f.key in fresh for f in retrain):
        asked = request_sync(
            pair.target_name,
            pair.target_version,
            source="weekly-review",
            retrain=True,
            event=events.DRAFTER_STALE,
            now=now,
            reason=f"{pair.deployment}: drafter v{pair.drafter_version} is stale "
            f"({', '.join(f.rule for f in retrain)})",
        )
        taken.append(
            f"retrain requested (event {events.DRAFTER_STALE} for {pair.target_name} v{pair.target_version}): the "
            f"drafter-sync deployment starts it as soon as a GPU worker is free; watch it at {links.flow_run_url()}"
            if asked.requested
            else f"retrain of {pair.target_name} v{pair.target_version} already requested: not repeated"
        )
    elif retrain:
        taken.append("retrain already requested this week for the same finding: not repeated")
    return taken


def _planned(findings) -> str:
    """What the acting review would do about these findings, for a read-only report."""
    words = {"fallback": "fall back to plain decoding", "retrain": "request a retrain"}
    wanted = {part for f in findings if f.severity != "info" for part in f.action.split("+") if part in words}
    return f"the acting review would {' and '.join(words[w] for w in sorted(wanted))}" if wanted else ""


def _write_charts(summaries, thresholds, charts_dir: str) -> dict[str, str]:
    """Each deployment's acceptance chart as a PNG in `charts_dir`; deployment -> path."""
    from pathlib import Path

    from draftsync.monitors.report import render_chart

    folder = Path(charts_dir)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for summary in summaries:
        path = folder / f"{re.sub(r'[^A-Za-z0-9._-]+', '-', summary.deployment)}-acceptance.png"
        path.write_bytes(render_chart(summary, thresholds))
        paths[summary.deployment] = str(path)
    return paths


def _status(findings) -> str:
    from draftsync.monitors.report import deployment_state

    state = deployment_state(findings)
    if state == "OK" and any(f.rule == "no_data" for f in findings):
        return "NO DATA"
    return state


def _week_domains(deployment: str, start: datetime, end: datetime, judged: tuple[int, int | None] | None) -> list:
    """The deployment's acceptance per client domain over the week's captured requests that the scrapes booked to
    the `judged` pair (target version, drafter version), or to any pair when None; none without capture."""
    from draftsync.monitors.trends import domain_acceptance

    rows = [
        r
        for r in context.store().acceptance.booked_requests(deployment, start, end)
        if judged is None or (r.target_version, r.drafter_version) == judged
    ]
    return domain_acceptance(rows) if rows else []


def _domains_text(deployment: str, domains: list) -> str:
    """Which domain drifted: each domain's rate, its spread and its share of the captured requests, worst first."""

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    parts = [
        f"{d.domain} {rate(d.acceptance_rate)} (P5 {rate(d.p5)}, P50 {rate(d.p50)}) on {d.share:.0%} of requests"
        for d in domains
    ]
    return f"{deployment} by client domain, over its captured requests: " + "; ".join(parts) + "."


def _finding_row(f) -> dict:
    return {
        "deployment": f.deployment,
        "rule": f.rule,
        "severity": f.severity,
        "value": f.value,
        "message": f.message,
        "action": f.action,
    }


def _deployment_row(pair, review: DeploymentReview, taken: list[str], now_serving, domains: list) -> dict:
    """One deployment's week as the report's `deployments` list holds it."""
    summary, found = review.summary, review.findings
    return {
        "name": pair.deployment,
        "acceptance_rate": summary.acceptance_rate,
        "p5": summary.interval_p5,
        "p50": summary.interval_p50,
        "trend_per_day": summary.slope_per_day,
        "week_over_week": review.week_over_week,
        "baseline": None
        if review.baseline is None
        else {
            "acceptance_rate": review.baseline.acceptance_rate,
            "std": review.baseline.std,
            "start": review.baseline.start.isoformat(),
        },
        "status": _status(found),
        "findings": [_finding_row(f) for f in found],
        "actions": taken,
        "mean_acceptance_length": summary.mean_acceptance_length,
        "draft_tokens": summary.draft_tokens,
        "server_restarts": summary.resets,
        "serving_state": now_serving.state,
        "serving_drafter_version": now_serving.drafter_version,
        "target": {"name": pair.target_name, "version": pair.target_version},
        "drafter_version": summary.drafter_version,
        "replaced_pairs": review.replaced,
        "predictions": [{**asdict(check), "text": check.text()} for check in review.predictions],
        "domains": [asdict(d) for d in domains],
    }


def _silent_note(spec: ServingDeployment) -> str:
    """Why a declared deployment has no row: a target MLflow does not hold, or no rollout or scrape yet."""
    if not context.registry().has_model(spec.target_name):
        return (
            f"{spec.name} is declared in the deployments file but serves target {spec.target_name!r}, which MLflow "
            f"does not hold: register it with `draftsync targets register`, or correct the deployment's target_name."
        )
    return (
        f"{spec.name} is declared in the deployments file but served nothing draftsync recorded: roll it out with "
        f"`draftsync rollout {spec.name}`, or check that its scrapes reach it."
    )


def _replaced_note(pair, old_pair: dict) -> str:
    """The note on a pair the deployment served earlier in the week, before the one the findings judge."""
    served = f"t{old_pair['target_version']}" + (
        f" + d{old_pair['drafter_version']}" if old_pair["drafter_version"] is not None else ", speculation off"
    )
    rate = old_pair["acceptance_rate"]
    return (
        f"{pair.deployment} also served {served} this week"
        + (f" (acceptance {rate:.2f} over {old_pair['draft_tokens']:,} drafted tokens)" if rate is not None else "")
        + f", before t{pair.target_version}"
        + (f" + d{pair.drafter_version}" if pair.drafter_version is not None else "")
        + ": the findings judge the pair serving now."
    )


def _deliver(mailer, message, clock, writes_email: bool, send: bool) -> tuple[str | None, str, int | None, str]:
    """The e-mail sent, written to the outbox unsent, or not written (read only): (its file, status, outbox entry,
    what happened to it)."""
    if not writes_email:
        return None, "not written", None, "read only: no e-mail was written"
    if send:
        entry = mailer.send(message, now=clock)
        status = entry.status
        retry = "kept in the outbox and retried next run" if status == "pending" else "given up after repeated failures"
        delivery = (
            f"sent by SMTP to {entry.recipients}"
            if status == "sent"
            else f"{status}: {entry.last_error or 'not delivered'}; {retry}"
        )
        return entry.eml_path, status, entry.id, delivery
    return str(mailer.write_unsent(message, now=clock)), "not sent", None, NOT_SENT


def _table_artifact(subject: str, rows: list[dict]) -> None:
    """The review in the Prefect UI: a row per deployment, its status, figures, findings and actions."""
    create_table_artifact(
        key="weekly-acceptance-report",
        description=f"Weekly acceptance review: {subject}",
        table=[
            {
                "deployment": r["name"],
                "status": r["status"],
                "acceptance": r["acceptance_rate"],
                "p5": r["p5"],
                "p50": r["p50"],
                "trend_per_day": r["trend_per_day"],
                "findings": "; ".join(f["rule"] for f in r["findings"]) or "-",
                "actions": "; ".join(r["actions"]),
            }
            for r in rows
        ],
    )


@flow(name="weekly-acceptance-report", log_prints=True)
def weekly_report(
    now: datetime | None = None,
    deployments: list[ServingDeployment] | None = None,
    notes: list[str] | None = None,
    week: str | None = None,
    send: bool = True,
    act: bool = True,
    charts_dir: str | None = None,
) -> dict:
    """Review the last 7 days (or look back at ISO `week`); stale drafters fall back and a retrain is requested.

    `deployments`: the specs to relaunch on a fallback (default: the deployments file, when it exists).
    `send`: deliver by SMTP when configured; False writes the e-mail to the outbox folder only. `act` False, without
    `send`: read only (nothing acted on, recorded or written but the charts). `charts_dir`: write each deployment's
    acceptance chart there as a PNG.
    Long: the review's order (each deployment judged and acted on, then the e-mail, then the alerts it carried)."""
    context.require_settings("weekly-acceptance-report", "registry", "store", "serving")
    from draftsync.monitors.mailer import Mailer
    from draftsync.monitors.report import build_weekly_report
    from draftsync.monitors.staleness import Thresholds
    from draftsync.tasks.secrets import smtp_password_block

    logger = get_run_logger()
    store, settings = context.store(), context.settings()
    if week is not None:
        start, end = iso_week_period(week, now)
        acting = False
    else:
        end = now or datetime.now(UTC)
        start, acting = end - WEEK, act
    writes_email = act or send
    problems: list[str] = []
    specs = configured_deployments(deployments, problems)  # relaunched only when acting; named when silent
    mailer = Mailer(settings.outbox_dir, store.outbox, settings, secret_loader=smtp_password_block)
    clock = end if acting else None  # a look back is written and sent at the real time
    retried = mailer.retry_pending(clock) if send else []

    summaries, findings, actions, targets, rows = [], [], {}, set(), []
    fresh: set[str] = set()
    replaced_notes: list[str] = []
    prediction_notes: list[str] = []
    domain_notes: list[str] = []
    for pair in store.pairs.all():
        review = review_deployment(pair.deployment, end)
        summary, found = review.summary, review.findings
        summaries.append(summary)
        findings.extend(found)
        targets.add(pair.target_name)
        for f in found if acting else []:
            if f.severity != "info" and store.alerts.should_send(
                f.key, end, f.value, severity=f.severity, higher_is_worse=f.higher_is_worse
            ):
                fresh.add(f.key)
        if acting:
            taken = _act(pair, review, specs, fresh, end) or ["none"]
        elif week is not None:
            taken = [f"none: a look back at {week} (actions are taken by the review of the last 7 days)"]
        else:
            planned = _planned(found)
            taken = [f"none yet: {planned}" if planned else "none"]
        actions[pair.deployment] = taken
        now_serving = store.pairs.get(pair.deployment) or pair  # after what this review did to it
        domains = _week_domains(pair.deployment, start, end, review.judged)
        rows.append(_deployment_row(pair, review, taken, now_serving, domains))
        if domains:
            domain_notes.append(_domains_text(pair.deployment, domains))
        replaced_notes.extend(_replaced_note(pair, old_pair) for old_pair in review.replaced)
        prediction_notes.extend(
            f"{pair.deployment} t{check.target_version} + d{check.drafter_version}, held to its validation: "
            f"{check.text()}"
            for check in review.predictions
        )

    thresholds = Thresholds.from_settings(settings)
    reviewed = {row["name"] for row in rows}
    silent = [_silent_note(specs[name]) for name in sorted(set(specs) - reviewed)]
    all_notes = list(notes or []) + problems + domain_notes + replaced_notes + prediction_notes + silent
    if week is not None:
        all_notes.append(f"A look back at ISO week {week}: no action was taken by this report.")
    elif not acting:
        all_notes.append(
            "Read only: nothing was acted on, recorded or e-mailed. The scheduled review acts; "
            "`draftsync report --act` acts now."
        )
    charts = _write_charts(summaries, thresholds, charts_dir) if charts_dir else {}
    message = build_weekly_report(
        summaries, findings, actions, _links(targets), (start, end), thresholds=thresholds, notes=all_notes
    )
    eml_path, status, entry_id, delivery = _deliver(mailer, message, clock, writes_email, send)
    if acting:
        for finding in findings:
            if finding.key in fresh:
                store.alerts.record_finding(finding, sent_at=end, outbox_id=entry_id)
    logger.info("weekly report %r written to %s (%s)", message["Subject"], eml_path, status)
    _table_artifact(message["Subject"], rows)
    return {
        "week": {"iso": week, "start": start.isoformat(), "end": end.isoformat()},
        "deployments": rows,
        "subject": message["Subject"],
        "eml_path": eml_path,
        "status": status,
        "sent": status == "sent",
        "delivery": delivery,
        "retried": [{"subject": e.subject, "status": e.status} for e in retried],
        "acted": acting,
        "thresholds": {"stale": thresholds.stale, "mismatch": thresholds.mismatch},
        "charts": charts,
        "notes": all_notes,
        "findings": [_finding_row(f) for f in findings],
        "actions": actions,
        "summaries": {s.deployment: {"acceptance_rate": s.acceptance_rate, "daily": s.daily} for s in summaries},
    }
