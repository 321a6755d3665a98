"""Asking for a drafter sync: through the ledger first, so duplicate triggers make exactly one sync.

Webhooks, the registry poll, alias moves, stale findings and rollouts all call `request_sync`; the
caller whose ledger row wins emits the event that the `drafter-sync` deployment is triggered by. A lost
event is not a lost sync: the poll finds requests nobody claimed and sends their event again. A dead run is
not a lost sync either: the poll gives its job back, and the next run resumes it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from draftsync.registry.tags import is_target as is_target_version
from draftsync.tasks import context, events

if TYPE_CHECKING:
    from draftsync.registry.webhooks import RegistryChange


@dataclass(frozen=True)
class SyncRequest:
    """What asking for a sync did: whether this call made (or re-opened) the job and so sent `event`, and how many
    GPUs that event asked the GPU pool for (both None when the job was already requested or done)."""

    target_name: str
    target_version: int
    method: str
    requested: bool
    event: str | None
    gpus: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def planned_method(profile_name: str | None = None) -> str:
    """The method a sync of the configured profile trains: part of the sync's idempotency key."""
    from draftsync.profiles import profile

    return profile(profile_name or context.settings().sync_profile).method


def sync_method(target_name: str, target_version: int, profile_method: str) -> str:
    """The method of a sync of this target version, part of its idempotency key: mtp for a version whose tags say it
    ships its own MTP head (its drafter is that head, flows/sync.py), else the profile's."""
    from draftsync.registry.tags import TargetVersion
    from draftsync.speculative.methods import MTP

    try:
        tags = context.registry().version_tags(target_name, target_version)
    except Exception:  # an unknown version or the registry down: the sync's own fetch says which, with its retries
        return profile_method
    return MTP.name if TargetVersion.from_tags(target_name, target_version, tags).mtp_head() else profile_method


def request_sync(
    target_name: str,
    target_version: int,
    *,
    source: str,
    reason: str,
    event: str = events.SYNC_REQUESTED,
    retrain: bool = False,
    method: str | None = None,
    now: datetime | None = None,
) -> SyncRequest:
    """Record the request; emit `event` only when this call is the one that made (or re-opened) the job."""
    method = method or sync_method(target_name, target_version, planned_method())
    won = context.sync_ledger().request(
        target_name, target_version, method, source=source, reason=reason, retrain=retrain, now=now
    )
    gpus = None
    if won:
        gpus = _gpus_to_ask_for(target_name, target_version)
        events.emit(
            event,
            target_name,
            target_version,
            payload={"reason": reason, "source": source, "method": method, "retrain": retrain},
            gpus=str(gpus),
        )
    context.logger().info(
        "sync of %s v%d (%s) %s: %s",
        target_name,
        target_version,
        method,
        "requested" if won else "already requested or done",
        reason,
    )
    return SyncRequest(target_name, int(target_version), method, won, event if won else None, gpus)


def _gpus_to_ask_for(target_name: str, target_version: int) -> int:
    """The sync event's GPU count (its trigger's job variables): what the plan uses on a pool node; the whole node
    when the registry cannot be read, since a request must not be lost to its sizing."""
    from draftsync.profiles import profile
    from draftsync.tasks.planning import requested_gpus

    settings = context.settings()
    try:
        return requested_gpus(target_name, target_version, profile(settings.sync_profile))
    except Exception as error:  # the registry down, a tag that is not a number: the sync's own plan still decides
        context.logger().warning(
            "%s v%d: sized as a whole pool node (%d GPUs): %s",
            target_name,
            target_version,
            settings.gpu_pool_gpus,
            error,
        )
        return settings.gpu_pool_gpus


def request_new_version_sync(
    target_name: str, target_version: int, *, source: str, reason: str, now: datetime | None = None
) -> SyncRequest:
    """What a new target version asks for, wherever it is noticed (a webhook delivery, `draftsync targets
    register`): a sync, with the event the `drafter-sync` deployment is triggered by. The ledger keeps it to one
    sync when the same version is announced twice (the CLI registers it and MLflow's webhook reports it)."""
    return request_sync(
        target_name, target_version, source=source, reason=reason, event=events.TARGET_VERSION_CREATED, now=now
    )


def run_owner() -> str:
    """This run, as the ledger records it: the Prefect flow run id and where its process lives."""
    from prefect.runtime import flow_run

    return f"{flow_run.id or 'no-run'}@{socket.gethostname()}:{os.getpid()}"[:100]


def owner_is_gone(owner: str | None) -> bool:
    """Whether the run that holds a job is over: its process on this host is gone, or its Prefect state is final
    (a process worker marks a run whose process died CRASHED)."""
    if not owner or "@" not in owner:
        return owner is not None
    run_id, _, place = owner.partition("@")
    host, _, pid = place.rpartition(":")
    if host == socket.gethostname() and pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
    return _run_is_over(run_id)


def _run_is_over(run_id: str) -> bool:
    import uuid

    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(uuid.UUID(run_id)).state
    except Exception:  # unknown id or another API: only the process check can tell
        return False
    return state is not None and state.is_final()


def release_dead_runs(now: datetime | None = None) -> list[dict]:
    """Give back the jobs of runs that died (a worker killed mid-sync) and send their sync event again.

    A job whose runs died MAX_ATTEMPTS times is marked failed instead: a sync that kills its worker every time
    (out of memory, say) must not loop."""
    ledger = context.sync_ledger()
    released = []
    for job in ledger.running():
        if not owner_is_gone(job.run_id):
            continue
        status = ledger.release(job.id, job.run_id, now=now)
        if status is None:
            continue
        if status == "requested":
            _send_again(job, f"re-sent: run {job.run_id} died")
        context.logger().warning(
            "sync of %s v%d (%s): run %s died; job %s",
            job.target_name,
            job.target_version,
            job.method,
            job.run_id,
            "requested again" if status == "requested" else "failed: too many attempts",
        )
        released.append(
            {
                "target_name": job.target_name,
                "target_version": job.target_version,
                "method": job.method,
                "status": status,
            }
        )
    return released


def resend_overdue(older_than: timedelta, now: datetime | None = None) -> list[dict]:
    """Send again the event of every request no sync has claimed within `older_than` (the event may be lost)."""
    ledger = context.sync_ledger()
    resent = []
    for job in ledger.overdue(older_than, now=now):
        _send_again(job, f"re-sent: unclaimed since {job.requested_at.isoformat()} ({job.reason})")
        ledger.touch_request(job.id, now=now)
        resent.append({"target_name": job.target_name, "target_version": job.target_version, "method": job.method})
    return resent


def _send_again(job, reason: str) -> None:
    """The reconciler's `draftsync.sync.requested` for a job already in the ledger (a retrain keeps its flag)."""
    events.emit(
        events.SYNC_REQUESTED,
        job.target_name,
        job.target_version,
        payload={"reason": reason, "source": "reconciler", "method": job.method, "retrain": job.generation > 0},
        gpus=str(_gpus_to_ask_for(job.target_name, job.target_version)),
    )


def is_target(model_name: str, tags: dict[str, str] | None = None, version: int | None = None) -> bool:
    """A model draftsync keeps drafters for: its versions are tagged as targets, or it is named in the settings."""
    if model_name in context.settings().target_names:
        return True
    if tags is None and version is not None:
        tags = context.registry().version_tags(model_name, version)
    return is_target_version(tags)


def handle_registry_change(change: RegistryChange, delivery_id: str) -> dict:
    """What the webhook receiver does with a verified registry change: request a sync, announce an alias move."""
    now = datetime.now(UTC)
    answer = {"delivery_id": delivery_id, "model": change.model_name, "version": change.version}
    # The registry, not the payload, says what the version is: a signed delivery may still name one that never existed.
    from draftsync.registry.checkpoint_checks import name_problem

    unholdable = name_problem(change.model_name)
    if unholdable:
        reason = f"ignored: not a target name ({unholdable})"
        return {**answer, "model": change.model_name[:80], "action": reason}
    registered = context.registry().registered_tags(change.model_name, change.version)
    if registered is None:
        return {**answer, "action": f"ignored: MLflow holds no version {change.version} of {change.model_name}"}
    if not is_target(change.model_name, registered, change.version):
        return {
            **answer,
            "action": "ignored: not a target (tag its versions draftsync.kind=target or list it in DRAFTSYNC_TARGETS)",
        }
    alias_moved = change.kind != "version_created"
    if alias_moved:
        events.emit(
            events.TARGET_ALIAS_MOVED,
            change.model_name,
            change.version,
            alias=change.alias or "",
            payload={"delivery_id": delivery_id},
        )
        reason = f"alias {change.alias!r} moved to version {change.version} (webhook {delivery_id})"
    else:
        reason = f"version {change.version} registered (webhook {delivery_id})"
    request = request_sync if alias_moved else request_new_version_sync
    asked = request(change.model_name, change.version, source="webhook", now=now, reason=reason)
    said = "sync requested" if asked.requested else "sync already requested"
    if not alias_moved:
        return {**answer, "action": said}
    return {**answer, "alias": change.alias, "action": "rollout announced; " + said}
