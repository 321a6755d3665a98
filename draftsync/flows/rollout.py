"""Rollout: serve the target version the deployment's alias points at, with the drafter validated for it.

The pair rule: when no validated drafter exists for that exact target version, the target is served
with speculation off (state `fallback`) rather than with a drafter trained for another version.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from draftsync.errors import DraftsyncError
from draftsync.serving.deployment import ServingDeployment
from draftsync.tasks import context
from draftsync.tasks.registration import drafter_model_name
from draftsync.tasks.serving import adopt_server, launch_server, smoke_request


@flow(name="rollout", log_prints=True)
def rollout(deployment: ServingDeployment, speculation: bool = True, reason: str = "") -> dict:
    """Launch the pair, check it answers, switch the deployment to it and stop the old instance."""
    logger = get_run_logger()
    registry = context.registry()
    store = context.store()
    target_version = registry.alias_version(deployment.target_name, deployment.target_alias)
    if target_version is None:
        raise DraftsyncError(
            f"target {deployment.target_name} has no alias {deployment.target_alias!r}",
            f"register a version and set the alias (deployment {deployment.name} follows it)",
        )
    target_dir = registry.download(deployment.target_name, target_version)
    drafter_name = drafter_model_name(deployment.target_name)
    drafter_version = registry.drafter_for_target_version(deployment.target_name, target_version) if speculation else None
    drafter_dir, gamma, method = None, 0, "eagle3"
    if drafter_version is not None:
        tags = registry.version_tags(drafter_name, drafter_version)
        drafter_dir = str(registry.download(drafter_name, drafter_version))
        gamma, method = int(tags["draftsync.gamma"]), tags["draftsync.method"]
    elif speculation:
        logger.warning(
            "no validated drafter for %s v%d: serving it with speculation off until a sync provides one",
            deployment.target_name, target_version,
        )
    launched = launch_server(deployment, str(target_dir), drafter_dir, gamma, method)
    smoke_request(launched["endpoint"], deployment.name, "def add(a, b):\n")
    adopt_server(deployment.name, launched)
    store.forget_scrape_baseline(deployment.name)  # the new instance's counters start from zero
    state = "serving" if drafter_version is not None else "fallback"
    store.set_serving_pair(
        deployment.name,
        target_name=deployment.target_name,
        target_version=target_version,
        drafter_name=drafter_name if drafter_version is not None else None,
        drafter_version=drafter_version,
        gamma=gamma,
        endpoint=launched["endpoint"],
        state=state,
    )
    result = {
        "deployment": deployment.name,
        "state": state,
        "target_version": target_version,
        "drafter_version": drafter_version,
        "gamma": gamma,
        "endpoint": launched["endpoint"],
        "vllm": launched["vllm"],
        "reason": reason,
    }
    create_markdown_artifact(
        key=f"rollout-{deployment.name}".lower().replace("_", "-").replace(".", "-"),
        markdown=(
            f"# {deployment.name}: {state}\n\nTarget {deployment.target_name} v{target_version}, drafter "
            f"{'v%s' % drafter_version if drafter_version else 'none (speculation off)'}, gamma {gamma}.\n\n"
            f"{reason}\n\nOn a GPU worker the same pair runs as:\n\n```\n{' '.join(launched['vllm']['argv'])}\n```\n"
        ),
        description="rollout",
    )
    logger.info("%s now %s: target v%d, drafter %s", deployment.name, state, target_version, drafter_version)
    return result
