"""`draftsync recommend`: the production guide's decision framework for one workload, as an answer with its reasons.

A plain function with typer options; the `draftsync` app registers it as `recommend`. Nothing heavy is
imported: it answers instantly and needs no MLflow, Prefect or GPU.
"""

from __future__ import annotations

from typing import Annotated, cast

import typer

from draftsync.cli.common import JsonOption, write_json
from draftsync.errors import DraftsyncError
from draftsync.planning.recommendation import Recommendation, recommend
from draftsync.planning.workload import FRAMEWORK_TASK, TASKS, Task, Workload, params_text, parse_params


def recommend_command(
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs the target is served on.")],
    gpu_memory_gb: Annotated[float, typer.Option("--gpu-memory-gb", help="Memory of one GPU in GB, e.g. 80.")],
    tpot_ms: Annotated[float, typer.Option("--tpot-ms", help="Time-per-output-token target in milliseconds.")],
    task: Annotated[
        str,
        typer.Option(
            "--task", help=f"Main task: {', '.join(TASKS)}; prose, as in a target's task mix, is read as chat."
        ),
    ],
    params: Annotated[str | None, typer.Option("--params", help="Target size: 70B, 7b, 1.5B, 500M.")] = None,
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="A registered target, NAME or NAME:VERSION (default: its production alias), instead of --params: "
            "its size, weight dtype and KV cache per token are read from the tags its checkpoint gave it.",
        ),
    ] = None,
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="Typical tokens per answer.")] = 1024,
    batch: Annotated[int, typer.Option("--batch", help="Requests served together (1: single-stream).")] = 1,
    json_path: JsonOption = None,
) -> None:
    """Recommend a drafter method, gamma range and start for a target, with the production guide's expected speedup,
    a memory check and the rule behind each step."""
    if (params is None) == (target is None):
        raise DraftsyncError(
            "recommend needs the target's size: give --params or --target, not both and not neither",
            "pass --params 70B, or --target NAME for a target in the registry",
        )
    facts: dict = {}
    head = None
    if target is not None:
        params_b, facts, head = _registered_target(target)
    else:
        params_b = parse_params(params or "")
    workload = Workload(
        params_b=params_b,
        gpus=gpus,
        gpu_memory_gb=gpu_memory_gb,
        tpot_ms=tpot_ms,
        task=cast(Task, framework_task(task)),  # Workload checks it is one of TASKS, with the fix
        output_tokens=output_tokens,
        batch=batch,
        **facts,
    )
    recommendation = recommend(workload)
    typer.echo(workload_text(workload))
    typer.echo(format_recommendation(recommendation))
    if head is not None:
        typer.echo(
            f"own head: {target} ships its own {head} MTP head, which a sync measures, refreshes when stale and serves "
            "with vLLM's method mtp; the method above is what a target without one would take"
        )
    write_json(recommendation.to_dict(), json_path)


def _registered_target(spec: str) -> tuple[float, dict, str | None]:
    """(size in billions, Workload memory facts, the family of the MTP head it ships or None) of a registered target
    version, from its tags."""
    from draftsync.planning.workload import target_memory_facts
    from draftsync.registry.tags import TargetVersion
    from draftsync.tasks import context

    name, colon, version_text = spec.partition(":")
    if colon and not (version_text.isdigit() and int(version_text) >= 1):
        raise DraftsyncError(
            f"--target {spec}: version {version_text!r} is not a version number",
            f"give --target {name}:N with N >= 1, or --target {name} for its production version",
        )
    registry = context.registry()
    if not registry.has_model(name):
        raise DraftsyncError(
            f"MLflow holds no registered model named {name!r}",
            "check the name (`draftsync status` lists the targets), or give the size with --params",
        )
    version = int(version_text) if version_text else registry.alias_version(name, "production")
    if version is None:
        raise DraftsyncError(
            f"target {name} has no production alias to read its size from", f"give a version: --target {name}:N"
        )
    found = TargetVersion.from_tags(name, version, registry.version_tags(name, version))
    facts = target_memory_facts(found.num_hidden_layers, found.features(), found.parameter_count())
    return found.parameter_count() / 1e9, facts, found.mtp_head()


def framework_task(task: str) -> str:
    """The decision framework's task for a task name of either vocabulary (a target's task mix says prose)."""
    name = task.strip().lower()
    return FRAMEWORK_TASK.get(name, name)


def workload_text(workload: Workload) -> str:
    """The inputs that decide the answer, defaults included, so a reader sees what was assumed."""
    w = workload
    serving = "single-stream (batch 1; --batch for batched serving)" if w.batch == 1 else f"batch {w.batch}"
    return (
        f"for:      {params_text(w.params_b)} target on {w.gpus} x {w.gpu_memory_gb:g} GB, TPOT target "
        f"{w.tpot_ms:g} ms, task {w.task}, {serving}, {w.output_tokens} output tokens"
    )


def format_recommendation(recommendation: Recommendation) -> str:
    """The short answer a person reads in a terminal: the decision first, then why."""
    r = recommendation
    if r.method == "none":
        gamma = "-"
    else:
        low, high = r.gamma_range
        gamma = f"{low}-{high}, start at {r.gamma_start}" if low != high else f"{low}, start at {r.gamma_start}"
    low_speedup, high_speedup = r.expected_speedup
    speedup = f"{low_speedup:g}x" if low_speedup == high_speedup else f"{low_speedup:g}-{high_speedup:g}x"
    lines = [
        f"method:   {r.method}",
        f"gamma:    {gamma}",
        f"speedup:  {speedup}",
        f"drafter:  {r.drafter_memory_gb:g} GB",
        f"memory:   {r.memory.arithmetic}",
        f"fits:     {'yes' if r.fits else 'no'}",
        "reasons:",
    ]
    lines += [f"  - {reason}" for reason in r.reasons]
    return "\n".join(lines)
