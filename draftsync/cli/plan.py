"""`draftsync plan`: what a sync of a target would need of a worker, stage by stage, or why it would be refused.

The same plan a sync makes as its first step, without running anything: from a registered target version, a
checkpoint, or a config-only directory (a transformers config.json is all it reads), on this machine or on a worker
described by its flags. It exits 1 when the sync would be refused, so a script can ask before it schedules.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from draftsync.cli.common import JsonOption, write_json

if TYPE_CHECKING:
    from draftsync.planning.sync_plan import SyncPlan


def plan_command(
    target: Annotated[
        str,
        typer.Argument(
            help="A checkpoint or config-only directory, or a registered target as NAME or NAME:VERSION "
            "(default version: its production alias)."
        ),
    ],
    profile: Annotated[str | None, typer.Option("--profile", help="Sync profile (default: the configured).")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs of the worker (default: this machine's).")] = None,
    gpu_memory_gb: Annotated[
        float | None, typer.Option("--gpu-memory-gb", help="Memory of one GPU, in GiB (an 80 GB H100: 80).")
    ] = None,
    host_memory_gb: Annotated[
        float | None, typer.Option("--host-memory-gb", help="Host memory, in GiB (default: what is available).")
    ] = None,
    disk_gb: Annotated[
        float | None, typer.Option("--disk-gb", help="Disk for the shards, in GiB (default: free at the work dir).")
    ] = None,
    nodes: Annotated[
        int,
        typer.Option(
            "--nodes", min=1, max=1024, help="Machines like this one that training may span (torchrun, c10d)."
        ),
    ] = 1,
    vllm_version: Annotated[
        str | None,
        typer.Option(
            "--vllm-version",
            help="The vLLM the worker's servers run, e.g. 0.32.0, or none (default: this machine's engine's).",
        ),
    ] = None,
    json_path: JsonOption = None,
) -> None:
    """Plan a sync of TARGET: per stage (responses, hidden states, training, validation) the GPU and host memory,
    disk and time it needs and the settings it takes, or the stage that does not fit, its numbers and the fix."""
    from draftsync.errors import DraftsyncError
    from draftsync.planning.sync_plan import plan_sync
    from draftsync.planning.target_shape import TargetShape
    from draftsync.planning.worker import detect_worker
    from draftsync.profiles import profile as named_profile
    from draftsync.serving.vllm_engine import installed_vllm_version
    from draftsync.settings import Settings
    from draftsync.speculative.data.corpora import response_prompts

    for flag, value in (("--gpus", gpus), ("--gpu-memory-gb", gpu_memory_gb)):
        if value is not None and value < (0 if flag == "--gpus" else 1e-9):
            raise DraftsyncError(f"{flag} {value} is not a usable size", f"give {flag} a positive number")
    if gpus and gpu_memory_gb is None and gpus != _visible_gpus():
        raise DraftsyncError(
            f"--gpus {gpus} describes another machine, whose GPU memory cannot be read from this one",
            "give --gpu-memory-gb as well",
        )
    settings = Settings()
    chosen = named_profile(profile or settings.sync_profile)
    directory, name, task_mix = _target(target)
    worker = detect_worker(
        settings.root,
        gpus=gpus,
        gpu_memory_gib=gpu_memory_gb,
        host_memory_gib=host_memory_gb,
        disk_gib=disk_gb,
        vllm_version=vllm_version,
        installed_vllm=installed_vllm_version,
    )
    worker = replace(worker, nodes=nodes)
    prompts = response_prompts(task_mix, chosen)
    plan = plan_sync(TargetShape.from_directory(directory, name), worker, chosen, len(prompts))
    commands = rendered_commands(plan, directory) if plan.fits else {}
    typer.echo(plan.markdown())
    for stage, line in commands.items():
        typer.echo(f"{stage}:\n  {line}")
    write_json({**plan.to_dict(), "commands": commands}, json_path)
    if not plan.fits:
        raise typer.Exit(1)


def rendered_commands(plan: SyncPlan, directory: Path) -> dict[str, str]:
    """What the sync would run, as shell lines to read or hand to a scheduler: the vLLM server of the responses and
    the validation (with the plan's tensor parallelism and devices), and the torchrun launch of the training."""
    import os
    import shlex

    from draftsync.serving.vllm_args import ServerResources, render_vllm_command
    from draftsync.speculative.train.ranks import command, rank_environment

    commands = {}
    # the GPUs as this machine sees them when it is the worker planned for; else in the plan's own numbering
    seen: dict[str, str] | None = None if "gpus" in plan.worker.detected else {}
    if plan.settings.get("servers"):
        servers = ServerResources.from_plan(plan.settings["servers"])
        launch = render_vllm_command(
            directory,
            port=8000,
            served_model_name=plan.target,
            tensor_parallel_size=servers.tensor_parallel_size,
            extra_args=[*servers.extra_args(), *_data_parallel(plan.settings["servers"])],
        )
        environment = [f"{key}={value}" for key, value in servers.environment(parent=seen).items()]
        commands["vllm_server"] = shlex.join([*environment, *launch.argv])
    processes = plan.settings["train_processes"]
    if plan.settings.get("trainer") == "speculators":
        commands.update(_speculators_commands(plan, directory))
    elif processes > 1:
        nodes = plan.worker.nodes
        spec = Path("<sync dir>") / "rank-spec.json"
        argv = command(spec, processes // nodes, nodes, "<first node>:29400" if nodes > 1 else None)
        ranks = rank_environment(plan.settings.get("training_devices", []), os.environ if seen is None else seen)
        commands["training"] = shlex.join([*(f"{key}={value}" for key, value in ranks.items()), "python", *argv[1:]])
    return commands


def _data_parallel(server: dict) -> list[str]:
    """vLLM's flag for the plan's replicas: one server over all their GPUs, its requests balanced among them."""
    replicas = int(server.get("data_parallel_size", 1))
    return ["--data-parallel-size", str(replicas)] if replicas > 1 else []


def _speculators_commands(plan: SyncPlan, directory: Path) -> dict[str, str]:
    """The speculators pipeline the sync would run: the vLLM server that writes the hidden states, then
    prepare-data, generate-offline-data and the training under torchrun."""
    import shlex

    from draftsync.speculative.train.speculators import (
        SpeculatorsTrainJob,
        hidden_state_server_command,
        render_commands,
    )

    nodes = plan.worker.nodes
    work = Path("<sync dir>") / "checkpoints" / "speculators"
    job = SpeculatorsTrainJob(
        target=str(directory),
        data=(str(work / "token-rows.jsonl"),),
        work_dir=str(work),
        output_dir=str(work / "checkpoints"),
        gpus_per_node=max(1, plan.settings["train_processes"] // nodes),
        nnodes=nodes,
        rdzv_endpoint="<first node>:29400" if nodes > 1 else None,
        vllm_tensor_parallel_size=int(plan.settings.get("servers", {}).get("tensor_parallel_size", 1)),
    )
    prepare, states, train = render_commands(job)
    return {
        "speculators_vllm_server": shlex.join(hidden_state_server_command(job)),
        "speculators_prepare_data": shlex.join(prepare),
        "speculators_hidden_states": shlex.join(states),
        "training": shlex.join(train),
    }


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _target(spec: str) -> tuple[Path, str, dict[str, float]]:
    """(directory, name, task mix) of a directory or a registered version (its declared task mix, else prose)."""
    from draftsync.errors import DraftsyncError
    from draftsync.registry.tags import TargetVersion

    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise DraftsyncError(f"{path} has no config.json", "give a checkpoint or a config-only directory")
        return path, path.name, {"prose": 1.0}
    from draftsync.tasks import context

    name, _, version_text = spec.partition(":")
    registry = context.registry()
    if version_text and not (version_text.isdigit() and int(version_text) >= 1):
        raise DraftsyncError(f"target version {version_text!r} is not a number", f"give {name}:N, N a version")
    version = int(version_text) if version_text else registry.alias_version(name, "production")
    if version is None:
        raise DraftsyncError(
            f"{spec} is neither a directory nor a target with a production alias",
            f"give a checkpoint directory, or a version: {name}:N",
        )
    tags = registry.version_tags(name, version)
    mix = TargetVersion.from_tags(name, version, tags).task_mix() or {"prose": 1.0}
    return registry.download(name, version), f"{name} v{version}", mix
