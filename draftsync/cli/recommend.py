"""`draftsync recommend`: the seed's decision framework for one workload, as an answer with its reasons.

A plain function with typer options; the `draftsync` app registers it as `recommend`. Nothing heavy is
imported: it answers instantly and needs no MLflow, Prefect or GPU.
"""

from __future__ import annotations

from typing import Annotated, cast

import typer

from draftsync.cli.common import JsonOption, write_json
from draftsync.serving.recommendation import Recommendation, recommend
from draftsync.serving.workload import TASKS, Task, Workload, parse_params


def recommend_command(
    params: Annotated[str, typer.Option("--params", help="Target size: 70B, 7b, 1.5B, 500M.")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs the target is served on.")],
    gpu_memory_gb: Annotated[float, typer.Option("--gpu-memory-gb", help="Memory of one GPU in GB, e.g. 80.")],
    tpot_ms: Annotated[float, typer.Option("--tpot-ms", help="Time-per-output-token target in milliseconds.")],
    task: Annotated[str, typer.Option("--task", help=f"Main task: {', '.join(TASKS)}.")],
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="Typical tokens per answer.")] = 1024,
    batch: Annotated[int, typer.Option("--batch", help="Requests served together (1: single-stream).")] = 1,
    json_path: JsonOption = None,
) -> None:
    """Recommend a drafter method, gamma range and start for a target, with the seed's expected speedup, a memory
    check and the rule behind each step."""
    workload = Workload(
        params_b=parse_params(params),
        gpus=gpus,
        gpu_memory_gb=gpu_memory_gb,
        tpot_ms=tpot_ms,
        task=cast(Task, task.strip().lower()),  # Workload checks it is one of TASKS, with the fix
        output_tokens=output_tokens,
        batch=batch,
    )
    recommendation = recommend(workload)
    typer.echo(format_recommendation(recommendation))
    write_json(recommendation.to_dict(), json_path)


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
