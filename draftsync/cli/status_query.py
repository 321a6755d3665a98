"""`draftsync status`, the gathering half: what the registry, the monitor store and the sync ledger say about
each target, as plain data the terminal table and the JSON are both made from.

Per target: its versions and aliases; its drafter versions with their lineage (the target version each was
trained for, method, validation status, aliases) and gamma, recommended (by the decision framework, written
by the sync) against measured (the knee validation found); each deployment serving it, with its state and
the last 7 days' acceptance (summed from the hourly rollups as the weekly report does); the last sync that
succeeded, and a newer attempt apart from it (a failed or refused sync does not hide the drafter that serves).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from draftsync.registry.model_registry import drafter_model_name
from draftsync.registry.tags import DrafterVersion

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


@dataclass(frozen=True)
class DeploymentStatus:
    """What one deployment serves now (drafter and gamma None with speculation off) and its week's acceptance."""

    name: str
    state: str
    target_version: int
    drafter_version: int | None
    gamma: int | None
    acceptance_7d: float | None  # None: no draft token in the last 7 days


@dataclass(frozen=True)
class TargetStatus:
    name: str
    aliases: dict[str, int]
    versions: list[int]
    drafters: list[DrafterStatus] = field(default_factory=list)
    deployments: list[DeploymentStatus] = field(default_factory=list)
    last_sync: dict[str, Any] | None = None  # the last sync that succeeded
    last_attempt: dict[str, Any] | None = None  # a newer job that did not (yet): requested, running or failed


def drafter_status(drafter: DrafterVersion, aliases: Sequence[str]) -> DrafterStatus:
    return DrafterStatus(
        version=drafter.version,
        trained_for=drafter.trained_for,
        method=drafter.method,
        validation=drafter.validation,
        aliases=sorted(aliases),
        gamma_measured=drafter.gamma_measured,
        gamma_recommended=drafter.gamma_recommended,
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


def week_acceptance(store, deployments: Sequence[str], now: datetime) -> dict[str, float | None]:
    """Acceptance over the 7 days up to `now` per deployment, from the hourly rollups (the weekly report's sums)."""
    from draftsync.monitors.trends import summarize_hourly

    start = now - LAST_WEEK
    rows = store.acceptance.rollup_window(start, now, list(deployments)) if deployments else {}
    return {
        name: summarize_hourly(rows.get(name, []), start, now, deployment=name).acceptance_rate for name in deployments
    }


def gather_status(
    registry, store, ledger, target_names: Iterable[str] = (), now: datetime | None = None
) -> list[TargetStatus]:
    """Every target: those tagged in the registry, those named in `target_names`, and those a deployment serves."""
    now = now or datetime.now(UTC)
    pairs = store.pairs.all()
    names = sorted(set(registry.target_names()) | set(target_names) | {pair.target_name for pair in pairs})
    acceptance = week_acceptance(store, [pair.deployment for pair in pairs], now)
    targets = []
    for name in names:
        versions = registry.target_versions_after(name, 0)
        aliases = {alias: info.version for info in versions for alias in info.aliases}
        drafters = [
            drafter_status(DrafterVersion.from_tags(info.name, info.version, info.tags), info.aliases)
            for info in registry.target_versions_after(drafter_model_name(name), 0)
        ]
        deployments = [
            DeploymentStatus(
                name=pair.deployment,
                state=pair.state,
                target_version=pair.target_version,
                drafter_version=pair.drafter_version,
                gamma=pair.gamma if pair.drafter_version is not None else None,
                acceptance_7d=acceptance[pair.deployment],
            )
            for pair in pairs
            if pair.target_name == name
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
