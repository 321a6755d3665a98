"""The registry watch: every target version newer than the watermark gets a drafter sync, in order.

Two ways to dispatch. `inline` (the demo, `draftsync watch`): the watch runs each sync as a subflow and
moves the watermark after it. `event` (the `registry-watch` deployment): the watch asks the ledger for a
sync and the `drafter-sync` deployment runs it on the GPU pool; the watch is then the reconciler behind
the MLflow webhooks: a version whose webhook was lost is found here, a request whose event was lost is
sent again, and the job of a sync whose worker died is given back and requested again.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from prefect import flow, get_run_logger

from draftsync.flows.rollout import rollout
from draftsync.flows.sync import sync
from draftsync.profiles import SyncProfile
from draftsync.serving.deployment import ServingDeployment
from draftsync.tasks import context, events
from draftsync.tasks.sync_requests import (
    planned_method,
    release_dead_runs,
    request_sync,
    resend_overdue,
    sync_method,
)

UNCLAIMED_AFTER = timedelta(minutes=15)  # a sync request no run claimed by then had its event lost


@flow(name="registry-watch", log_prints=True)
def watch(
    target_name: str | None = None,
    deployment: ServingDeployment | None = None,
    profile: str | SyncProfile | None = None,
    dispatch: Literal["inline", "event"] = "inline",
) -> dict:
    """Poll the registry (the backstop for lost webhooks). `target_name` None: every target it knows."""
    context.require_settings("registry-watch", "registry", "store")
    registry = context.registry()
    registry.ping()
    names = (
        [target_name] if target_name else sorted(set(registry.target_names()) | set(context.settings().target_names))
    )
    watched = [_watch_one(name, deployment, profile, dispatch) for name in names]
    released = release_dead_runs() if dispatch == "event" else []
    resent = resend_overdue(UNCLAIMED_AFTER) if dispatch == "event" else []
    if target_name:
        return {**watched[0], "resent": resent, "released": released}
    return {"targets": watched, "resent": resent, "released": released}


def _watch_one(
    target_name: str, deployment: ServingDeployment | None, profile: str | SyncProfile | None, dispatch: str
) -> dict:
    logger = get_run_logger()
    registry, store = context.registry(), context.store()
    mark = store.watermarks.get(target_name) or 0
    new_versions = [info.version for info in registry.target_versions_after(target_name, mark)]
    logger.info("%s: watermark %d, new versions %s", target_name, mark, new_versions or "none")
    syncs = []
    for version in new_versions:
        if dispatch == "event":
            chosen = profile.method if isinstance(profile, SyncProfile) else planned_method(profile)
            method = sync_method(target_name, version, chosen)
            syncs.append(
                request_sync(
                    target_name,
                    version,
                    source="poll",
                    method=method,
                    reason=f"version {version} found by the registry poll",
                    event=events.TARGET_VERSION_CREATED,
                ).as_dict()
            )
        else:
            syncs.append(sync(target_name, version, profile, reason=f"version {version} found by the registry poll"))
        store.watermarks.set(target_name, version)
    rolled = None
    if deployment and new_versions and dispatch == "inline":
        rolled = rollout(deployment, reason=f"new target versions {new_versions}")
    return {
        "target_name": target_name,
        "watermark_before": mark,
        "new_versions": new_versions,
        "syncs": syncs,
        "rollout": rolled,
    }
