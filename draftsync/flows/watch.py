"""The registry watch: every target version newer than the watermark gets a drafter sync, in order."""

from __future__ import annotations

from prefect import flow, get_run_logger

from draftsync.serving.deployment import ServingDeployment
from draftsync.flows.rollout import rollout
from draftsync.flows.sync import sync
from draftsync.tasks import context
from draftsync.tasks.profile import SyncProfile


@flow(name="registry-watch", log_prints=True)
def watch(target_name: str, deployment: ServingDeployment | None = None, profile: str | SyncProfile = "demo") -> dict:
    """Poll the registry (the backstop for lost webhooks); the watermark moves only after a sync finishes."""
    logger = get_run_logger()
    registry, store = context.registry(), context.store()
    registry.ping()
    mark = store.get_watermark(target_name) or 0
    new_versions = [info.version for info in registry.target_versions_after(target_name, mark)]
    logger.info("%s: watermark %d, new versions %s", target_name, mark, new_versions or "none")
    syncs = []
    for version in new_versions:
        syncs.append(sync(target_name, version, profile))
        store.set_watermark(target_name, version)
    rolled = rollout(deployment, reason=f"new target versions {new_versions}") if deployment and new_versions else None
    return {"target_name": target_name, "watermark_before": mark, "new_versions": new_versions, "syncs": syncs, "rollout": rolled}
