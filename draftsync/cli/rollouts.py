"""`draftsync rollout` and `draftsync rollback`: serve the pair a deployment's aliases name, or the one before."""

from __future__ import annotations

from typing import Annotated

import typer

from draftsync.cli.common import JsonOption, check_registry, echo_json, write_json

DeploymentArgument = Annotated[str, typer.Argument(help="Deployment name, as declared in the deployments file.")]


def _deployment(name: str):
    from draftsync.serving.deployment import find_deployment, load_deployments
    from draftsync.tasks import context

    return find_deployment(load_deployments(context.settings().deployments_path), name)


def rollout(
    deployment: DeploymentArgument,
    drafter_version: Annotated[
        int | None,
        typer.Option(
            "--drafter-version", help="Serve this validated drafter version (default: the one for the served target)."
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the launch as a command to paste into a shell; start nothing.")
    ] = False,
    canary_requests: Annotated[
        int,
        typer.Option(
            "--canary-requests", help="Canary requests to send after the switch (0: live traffic is the canary)."
        ),
    ] = 0,
    json_path: JsonOption = None,
) -> None:
    """Roll the deployment's pair out: candidate, checks, switch, canary; rolls back by itself on a bad canary."""
    from draftsync.flows.rollout import rollout as rollout_flow

    spec = _deployment(deployment)
    check_registry()
    if dry_run:
        from draftsync.flows.rollout import planned_launch
        from draftsync.serving.process import free_port

        # the deployment's own port, or (0: chosen at launch) one free now
        port = spec.port or free_port()
        result = {**planned_launch(spec, drafter_version, port=port)[2], "dry_run": True, "port": port}
        drafter = "speculation off" if result["drafter_version"] is None else f"drafter v{result['drafter_version']}"
        typer.echo(
            f"{spec.name}: target v{result['target_version']} + {drafter}, gamma {result['gamma']}; "
            f"port {port}{'' if spec.port else ' (free now; a rollout picks its own)'}. Nothing was started.\n"
        )
        typer.echo(result["command"])
        write_json(result, json_path)
        return
    result = rollout_flow(
        spec, drafter_version=drafter_version, canary_requests=canary_requests, reason="rolled out by hand"
    )
    echo_json(result)
    write_json(result, json_path)


def rollback(deployment: DeploymentArgument, json_path: JsonOption = None) -> None:
    """Point the drafter's `production` back at `previous` and serve that pair."""
    from draftsync.flows.rollout import rollback as rollback_flow

    spec = _deployment(deployment)
    check_registry()
    result = rollback_flow(spec)
    echo_json(result)
    write_json(result, json_path)
