"""Registry steps of the loop: publish a target version, fetch one, register and promote a drafter."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from draftsync.registry.model_registry import drafter_model_name
from draftsync.tasks import context

__all__ = ["drafter_model_name", "fetch_target", "promote_drafter", "publish_target", "register_drafter"]


@task(name="publish-target", cache_policy=NONE)
def publish_target(name: str, checkpoint_dir: str, task_mix: dict[str, float], alias: str = "production") -> int:
    """Register a target checkpoint as a new version and point `alias` at it (what a model team does)."""
    from draftsync.registry.model_registry import target_tags
    from draftsync.speculative.targets import describe_target

    registry = context.registry()
    facts = {**describe_target(Path(checkpoint_dir)), "task_mix": task_mix}
    version = registry.register_target(name, Path(checkpoint_dir), target_tags(**facts))
    registry.set_target_alias(name, alias, version)
    context.logger().info("target %s version %d registered, alias %s", name, version, alias)
    return version


@task(name="fetch-target", retries=2, retry_delay_seconds=5, cache_policy=NONE)
def fetch_target(name: str, version: int) -> dict:
    """A local copy of the target version and its registry tags."""
    registry = context.registry()
    path = registry.download(name, version)
    return {"path": str(path), "tags": registry.version_tags(name, version)}


@task(name="register-drafter", retries=2, retry_delay_seconds=5, cache_policy=NONE)
def register_drafter(
    target_name: str,
    target_version: int,
    drafter_dir: str,
    method: str,
    gamma: int,
    validation: dict,
    training: dict,
    history_path: str | None = None,
) -> int:
    """Register the drafter with its lineage and training curves; a retried sync gets the same version back."""
    import json

    registry = context.registry()
    history = json.loads(Path(history_path).read_text()) if history_path and Path(history_path).exists() else None
    metrics = {k: float(v) for k, v in validation["metrics"].items()}
    tags = {f"draftsync.gate.{g['name']}": "pass" if g["passed"] else "fail" for g in validation["gates"]}
    tags.update({f"draftsync.training.{k}": str(v) for k, v in training.items()})
    version = registry.register_drafter(
        target_name,
        target_version,
        Path(drafter_dir),
        method,
        gamma,
        metrics,
        extra_tags=tags,
        validation_passed=validation["passed"],
        metric_history=history,
        sync_key=f"{target_name}:{target_version}:{method}",
    )
    context.logger().info("drafter version %d registered for %s v%d", version, target_name, target_version)
    return version


@task(name="promote-drafter", cache_policy=NONE)
def promote_drafter(target_name: str, drafter_version: int) -> None:
    context.registry().promote(target_name, drafter_version)
