"""`draftsync status`, the gathering half: what the registry, the monitor store and the sync ledger say about
each target, as plain data the terminal table and the JSON are both made from.

Per target: its versions and aliases; its drafter versions with their lineage (the target version each was
trained for, method, validation status, aliases) and gamma, recommended (by the decision framework, written
by the sync) against measured (the knee validation found); each deployment serving it, with its state and
the weekly review's judgement of it; the last sync that succeeded, and a newer attempt apart from it (a failed
or refused sync does not hide the drafter that serves).

A deployment's figures are the weekly review's own (`review_deployment`, called read-only, the computation
`draftsync report` and the weekly e-mail use), so status and the report cannot disagree: the acceptance over the
last 7 days of the pair serving now, its hours only (after a fallback, of the drafter it fell back from), its
non-info findings and the pairs it replaced this week. The pooled week, every pair's hours together, is kept
apart: a stale pair replaced mid-week drags it down while the pair serving now is fine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.registry.model_registry import drafter_model_name
from draftsync.registry.tags import DrafterVersion, TargetVersion

if TYPE_CHECKING:
    from draftsync.tasks.monitoring import DeploymentReview

    Review = Callable[[str, datetime], DeploymentReview]

LAST_WEEK = timedelta(days=7)


@dataclass(frozen=True)
class DrafterStatus:
    """One drafter version and its lineage; gammas are None where nothing was recorded."""

    version: int
    trained_for: int | None
    method: str | None
    validation: str
    aliases: list[str]
    gamma_measured: int | None
    gamma_recommended: dict[str, Any] | None  # {"start": int | None, "range": [lo, hi] | None}
    mtp_head: str | None = None  # the target's own MTP head: shipped | refreshed; None for a trained drafter


@dataclass(frozen=True)
class DeploymentStatus:
    """What one deployment serves now (drafter and gamma None with speculation off) and how the weekly review
    judges it: the acceptance of the judged pair over the last 7 days, its hours only, as `draftsync report`
    gives it; the pooled week of every pair it served apart."""

    name: str
    state: str
    target_version: int
    drafter_version: int | None
    gamma: int | None
    acceptance_7d: float | None  # the judged pair's hours only (the report's figure); None: no draft token
    draft_tokens_7d: int  # the judged pair's drafted tokens over the week
    judged: dict[str, int | None] | None  # {"target_version", "drafter_version"}: the pair the figures are of
    pooled_acceptance_7d: float | None  # every pair's hours of the week together
    pooled_draft_tokens_7d: int
    replaced_pairs: list[dict[str, Any]] = field(default_factory=list)  # the week's other pairs, as the report's
    findings: list[dict[str, Any]] = field(default_factory=list)  # the review's warnings and criticals
    review_error: str | None = None  # why the review could not judge it (the figures are then None)


@dataclass(frozen=True)
class TargetStatus:
    name: str
    aliases: dict[str, int]
    versions: list[int]
    drafters: list[DrafterStatus] = field(default_factory=list)
    deployments: list[DeploymentStatus] = field(default_factory=list)
    last_sync: dict[str, Any] | None = None  # the last sync that succeeded
    last_attempt: dict[str, Any] | None = None  # a newer job that did not (yet): requested, running or failed
    # the versions that ship their own MTP head (a sync keeps that head as their drafter): [{"version", "family"}]
    mtp_heads: list[dict[str, Any]] = field(default_factory=list)


def drafter_status(drafter: DrafterVersion, aliases: Sequence[str]) -> DrafterStatus:
    return DrafterStatus(
        version=drafter.version,
        trained_for=drafter.trained_for,
        method=drafter.method,
        validation=drafter.validation,
        aliases=sorted(aliases),
        gamma_measured=drafter.gamma_measured,
        gamma_recommended=drafter.gamma_recommended,
        mtp_head=drafter.mtp_head,
    )


def _job_moment(job) -> datetime:
    """When a job last changed: a re-opened job keeps its old finish time, so take the latest of the three."""
    return max(moment for moment in (job.requested_at, job.started_at, job.finished_at) if moment is not None)


def last_sync(jobs: Iterable) -> dict[str, Any] | None:
    """The ledger's most recently changed job of a target as plain data (times in ISO 8601), or None."""
    return _job_data(max(jobs, key=_job_moment, default=None))


def last_good_sync(jobs: Iterable) -> dict[str, Any] | None:
    """The most recent sync that succeeded: a failed, refused or pending attempt after it does not replace it."""
    return last_sync(job for job in jobs if job.status == "succeeded")


def last_attempt(jobs: Iterable) -> dict[str, Any] | None:
    """The most recently changed job when it is not the last good sync (it is pending, running or failed), or None."""
    jobs = list(jobs)
    latest, good = last_sync(jobs), last_good_sync(jobs)
    return None if latest == good else latest


def _job_data(job) -> dict[str, Any] | None:
    if job is None:
        return None

    def moment(value: datetime | None) -> str | None:
        return None if value is None else value.isoformat()

    return {
        "target_version": job.target_version,
        "method": job.method,
        "status": job.status,
        "generation": job.generation,
        "attempts": job.attempts,
        "source": job.source,
        "reason": job.reason,
        "requested_at": moment(job.requested_at),
        "started_at": moment(job.started_at),
        "finished_at": moment(job.finished_at),
        "drafter_version": job.drafter_version,
        "detail": job.detail,
    }


def pooled_week(store, deployments: Sequence[str], now: datetime) -> dict[str, tuple[float | None, int]]:
    """(acceptance, drafted tokens) over the 7 days up to `now` per deployment, every pair it served pooled, from
    the hourly rollups in one query."""
    from draftsync.monitors.trends import summarize_hourly

    start = now - LAST_WEEK
    rows = store.acceptance.rollup_window(start, now, list(deployments)) if deployments else {}
    summaries = {name: summarize_hourly(rows.get(name, []), start, now, deployment=name) for name in deployments}
    return {name: (summary.acceptance_rate, summary.draft_tokens) for name, summary in summaries.items()}


def _finding_data(finding) -> dict[str, Any]:
    return {
        "rule": finding.rule,
        "severity": finding.severity,
        "message": finding.message,
        "action": finding.action,
    }


def deployment_status(pair, review: Review, pooled: tuple[float | None, int], now: datetime) -> DeploymentStatus:
    """One deployment as status shows it: what it serves, and the weekly review's figures and findings of it.

    `review` is `review_deployment` (its plain function: it only reads the store and the drafter's tags); a
    review that cannot judge the deployment (a drafter version without its lineage tag) leaves the figures None
    and says why, rather than failing the whole status."""
    base = {
        "name": pair.deployment,
        "state": pair.state,
        "target_version": pair.target_version,
        "drafter_version": pair.drafter_version,
        "gamma": pair.gamma if pair.drafter_version is not None else None,
        "pooled_acceptance_7d": pooled[0],
        "pooled_draft_tokens_7d": pooled[1],
    }
    try:
        week = review(pair.deployment, now)
    except DraftsyncError as error:
        return DeploymentStatus(
            **base, acceptance_7d=None, draft_tokens_7d=0, judged=None, review_error=error.what.splitlines()[0]
        )
    return DeploymentStatus(
        **base,
        acceptance_7d=week.summary.acceptance_rate,
        draft_tokens_7d=week.summary.draft_tokens,
        judged=None if week.judged is None else {"target_version": week.judged[0], "drafter_version": week.judged[1]},
        replaced_pairs=list(week.replaced),
        findings=[_finding_data(f) for f in week.findings if f.severity != "info"],
    )


def gather_status(
    registry,
    store,
    ledger,
    target_names: Iterable[str] = (),
    now: datetime | None = None,
    review: Review | None = None,
) -> list[TargetStatus]:
    """Every target: those tagged in the registry, those named in `target_names`, and those a deployment serves.

    `review` judges a deployment (default: the weekly review's `review_deployment`, which reads the work dir's
    store and registry, so pass those as `registry` and `store`)."""
    if review is None:
        from draftsync.tasks.monitoring import review_deployment

        review = review_deployment.fn
    now = now or datetime.now(UTC)
    pairs = store.pairs.all()
    names = sorted(set(registry.target_names()) | set(target_names) | {pair.target_name for pair in pairs})
    pooled = pooled_week(store, [pair.deployment for pair in pairs], now)
    targets = []
    for name in names:
        versions = registry.target_versions_after(name, 0)
        aliases = {alias: info.version for info in versions for alias in info.aliases}
        drafters = [
            drafter_status(DrafterVersion.from_tags(info.name, info.version, info.tags), info.aliases)
            for info in registry.target_versions_after(drafter_model_name(name), 0)
        ]
        deployments = [
            deployment_status(pair, review, pooled[pair.deployment], now) for pair in pairs if pair.target_name == name
        ]
        targets.append(
            TargetStatus(
                name=name,
                aliases=dict(sorted(aliases.items())),
                versions=[info.version for info in versions],
                drafters=drafters,
                deployments=deployments,
                last_sync=last_good_sync(jobs := ledger.jobs(name)),
                last_attempt=last_attempt(jobs),
                mtp_heads=[
                    {"version": info.version, "family": head}
                    for info in versions
                    if (head := TargetVersion.from_tags(name, info.version, info.tags).mtp_head())
                ],
            )
        )
    return targets


def current_status(now: datetime | None = None) -> dict[str, Any]:
    """The status of this work dir's registry and store, as the JSON `draftsync status --json` writes, with the
    problems of the declared deployments."""
    from draftsync.tasks import context
    from draftsync.tasks.serving import declared_deployment_problems

    targets = gather_status(
        context.registry(), context.store(), context.sync_ledger(), context.settings().target_names, now
    )
    return {"targets": [asdict(target) for target in targets], "problems": declared_deployment_problems()}
