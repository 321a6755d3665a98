"""The Prefect events draftsync emits: the deployments' triggers match these names and labels.

Every event names its target in the resource labels `draftsync.target.name` and
`draftsync.target.version` (strings, as Prefect labels are), so a trigger fills the flow's parameters
with `{{ event.resource['draftsync.target.name'] }}` and the Prefect UI groups events by target version.
"""

from __future__ import annotations

from typing import Any

TARGET_VERSION_CREATED = "draftsync.target.version.created"  # a new target version: train its drafter
SYNC_REQUESTED = "draftsync.sync.requested"  # any other reason to sync (an alias move, a missing drafter, by hand)
DRAFTER_STALE = "draftsync.drafter.stale"  # the weekly review found a stale drafter: retrain
TARGET_ALIAS_MOVED = "draftsync.target.alias.moved"  # serve what the alias now points at
DRAFTER_VALIDATED = "draftsync.drafter.validated"  # a drafter passed the checklist and is production
SYNC_EVENTS = (TARGET_VERSION_CREATED, SYNC_REQUESTED, DRAFTER_STALE)
# A sync event's label (`emit(..., gpus=...)`): how many GPUs its sync asks the GPU pool for, one of
# settings.GPU_COUNTS; drafter-sync has a trigger for each count, with the job variables that give its run that many.
GPUS_LABEL = "draftsync.gpus"
ROLLOUT_EVENTS = (DRAFTER_VALIDATED, TARGET_ALIAS_MOVED)


def target_resource(target_name: str, target_version: int, **labels: str) -> dict[str, str]:
    resource = {
        "prefect.resource.id": f"draftsync.target.{target_name}.v{int(target_version)}",
        "prefect.resource.name": f"{target_name} v{int(target_version)}",
        "draftsync.target.name": target_name,
        "draftsync.target.version": str(int(target_version)),
    }
    resource.update({f"draftsync.{key}": str(value) for key, value in labels.items()})
    return resource


def emit(
    event: str, target_name: str, target_version: int, payload: dict[str, Any] | None = None, **labels: str
) -> str | None:
    """Emit one event about a target version; returns its id (None when events are off in this process)."""
    from prefect.events import emit_event

    sent = emit_event(
        event=event, resource=target_resource(target_name, target_version, **labels), payload=payload or {}
    )
    return str(sent.id) if sent is not None else None
