"""Asking for a drafter sync: through the ledger first, so duplicate triggers make exactly one sync.

Webhooks, the registry poll, alias moves, stale findings and rollouts all call `request_sync`; the
caller whose ledger row wins emits the event that the `drafter-sync` deployment is triggered by. A lost
event is not a lost sync: the poll finds requests nobody claimed and sends their event again.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from draftsync.tasks import context, events

if TYPE_CHECKING:
    from draftsync.registry.webhooks import RegistryChange

KIND_TAG = "draftsync.kind"


def planned_method(profile_name: str | None = None) -> str:
    """The method a sync of the configured profile trains: part of the sync's idempotency key."""
    from draftsync.tasks.profile import profile

    return profile(profile_name or context.settings().sync_profile).method


def request_sync(target_name: str, target_version: int, *, source: str, reason: str,
                 event: str = events.SYNC_REQUESTED, retrain: bool = False, method: str | None = None,
                 now: datetime | None = None) -> dict:
    """Record the request; emit `event` only when this call is the one that made (or re-opened) the job."""
    method = method or planned_method()
    won = context.sync_ledger().request(target_name, target_version, method, source=source, reason=reason,
                                        retrain=retrain, now=now)
    if won:
        events.emit(event, target_name, target_version, payload={"reason": reason, "source": source,
                                                                 "method": method, "retrain": retrain})
    context.logger().info("sync of %s v%d (%s) %s: %s", target_name, target_version, method,
                          "requested" if won else "already requested or done", reason)
    return {"target_name": target_name, "target_version": int(target_version), "method": method,
            "requested": won, "event": event if won else None}


def resend_overdue(older_than: timedelta, now: datetime | None = None) -> list[dict]:
    """Send again the event of every request no sync has claimed within `older_than` (the event may be lost)."""
    ledger = context.sync_ledger()
    resent = []
    for job in ledger.overdue(older_than, now=now):
        events.emit(events.SYNC_REQUESTED, job.target_name, job.target_version,
                    payload={"reason": f"re-sent: unclaimed since {job.requested_at.isoformat()} ({job.reason})",
                             "source": "reconciler", "method": job.method, "retrain": job.generation > 0})
        ledger.touch_request(job.id, now=now)
        resent.append({"target_name": job.target_name, "target_version": job.target_version, "method": job.method})
    return resent


def is_target(model_name: str, tags: dict[str, str] | None = None, version: int | None = None) -> bool:
    """A model draftsync keeps drafters for: its versions are tagged as targets, or it is named in the settings."""
    if model_name in context.settings().target_names:
        return True
    if tags is None and version is not None:
        tags = context.registry().version_tags(model_name, version)
    return (tags or {}).get(KIND_TAG) == "target"


def handle_registry_change(change: RegistryChange, delivery_id: str) -> dict:
    """What the webhook receiver does with a verified registry change: request a sync, announce an alias move."""
    now = datetime.now(UTC)
    answer = {"delivery_id": delivery_id, "model": change.model_name, "version": change.version}
    if not is_target(change.model_name, change.tags if change.kind == "version_created" else None, change.version):
        return {**answer, "action": "ignored: not a target (tag its versions draftsync.kind=target or list it in "
                                    "DRAFTSYNC_TARGETS)"}
    if change.kind == "version_created":
        asked = request_sync(change.model_name, change.version, source="webhook", now=now,
                             reason=f"version {change.version} registered (webhook {delivery_id})",
                             event=events.TARGET_VERSION_CREATED)
        return {**answer, "action": "sync requested" if asked["requested"] else "sync already requested"}
    events.emit(events.TARGET_ALIAS_MOVED, change.model_name, change.version, alias=change.alias or "",
                payload={"delivery_id": delivery_id})
    asked = request_sync(change.model_name, change.version, source="webhook", now=now,
                         reason=f"alias {change.alias!r} moved to version {change.version} (webhook {delivery_id})")
    return {**answer, "alias": change.alias,
            "action": "rollout announced; " + ("sync requested" if asked["requested"] else "sync already requested")}
