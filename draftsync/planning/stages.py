"""A plan's stages, what holds each GPU while a stage runs, and the refusals a plan can end in.

A sync runs its stages one after another: `responses` (a vLLM server of the target, no drafter), `hidden_states` (the
target in transformers), `training` (torchrun ranks, or one process beside the target when the states are computed
online) and `validation` (a vLLM server of the target and its drafter). Each stage lists the processes that hold GPU
memory while it runs (`Occupant`), those of earlier stages it keeps included; `overlap_refusal` checks every GPU of
every stage against what the worker leaves free, before any work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from draftsync.planning.worker import GPU_RESERVE_GIB, GiB, Worker, size_text


@dataclass(frozen=True)
class Occupant:
    """A process holding `gib` on each of `gpus` while a stage runs: `holder` says whose it is and what it is."""

    holder: str
    gpus: tuple[int, ...]
    gib: float
    replica: int = 0  # a server's GPUs a data-parallel replica (its first `replica` GPUs run it alone); 0: not one

    def least_gpus(self) -> tuple[int, ...]:
        """The GPUs it needs at the least: one replica's for a server, which takes more as replicas when given them."""
        return tuple(sorted(self.gpus)[: self.replica]) if self.replica else self.gpus


@dataclass(frozen=True)
class StagePlan:
    """One stage's needs: the peak on its busiest GPU, host memory, disk written, an estimated time, its settings,
    what holds each GPU while it runs, and the figures behind its time, so a reader can check the arithmetic."""

    stage: str
    gpu_gib: float
    host_gib: float
    disk_gib: float
    hours_estimate: float
    settings: dict[str, Any]
    occupants: tuple[Occupant, ...] = ()
    assumptions: str = ""


@dataclass(frozen=True)
class Refusal:
    """Why a sync cannot run on this worker: the stage, what it needs against what there is, and the fix."""

    stage: str
    needed: str
    available: str
    fix: str
    reason: str = ""  # a refusal no worker lifts (the target itself): said as it is

    def message(self) -> str:
        if self.reason:
            return self.reason
        return f"the sync's {self.stage} stage needs {self.needed}; this worker has {self.available}"


def overlap_refusal(stages: tuple[StagePlan, ...] | list[StagePlan], worker: Worker) -> Refusal | None:
    """The first GPU, in the order the stages run, whose occupants together take more than it leaves a sync (its
    memory less what serving holds there and the reserve); None when every stage fits every GPU it touches."""
    for stage in stages:
        for gpu in sorted({g for occupant in stage.occupants for g in occupant.gpus}):
            there = [o for o in stage.occupants if gpu in o.gpus]
            total = sum(o.gib for o in there)
            free = worker.free_gib(gpu) if gpu < worker.gpus else 0.0
            if total <= free + 0.005:
                continue
            parts = " + ".join(f"{o.holder} {o.gib:.1f} GiB" for o in there)
            held = "".join(f", {h.deployment} holds {h.gib:.1f} GiB" for h in worker.holders(gpu))
            return Refusal(
                stage.stage,
                f"{total:.1f} GiB on GPU {gpu} at once ({parts})",
                f"{free:.1f} GiB free on GPU {gpu} of {worker.gpus} (of its {worker.gpu_memory_gib:.0f} GiB{held})",
                "give the sync a worker with more or larger GPUs, or free the GPUs serving deployments hold",
            )
    return None


def gpu_refusal(stage: str, needed: float, worker: Worker, room: float, gpu: int | None = None) -> Refusal:
    """A stage whose target (or server) does not fit the GPUs there are: the GiB needed and the GPUs it would take."""
    holders = worker.holders(gpu if gpu is not None else 0)
    held = "; ".join(f"serving deployment {h.deployment} holds {h.gib:.1f} GiB of each of its GPUs" for h in holders)
    usable = max(worker.gpu_memory_gib - GPU_RESERVE_GIB, 1.0)
    wanted = 2 ** math.ceil(math.log2(max(1.0, needed / GiB / usable)))
    fix = f"give the sync a worker of at least {wanted} x {worker.gpu_memory_gib:.0f} GiB GPUs" + (
        f", or free the GPUs that {', '.join(h.deployment for h in holders)} hold" if holders else ""
    )
    what = (
        "server" if stage in ("responses", "validation") else "weights (16-bit, or as quantized) and one forward pass"
    )
    there = f"{size_text(room / GiB)} GiB free on {worker.gpus} x {worker.gpu_memory_gib:.0f} GiB"
    return Refusal(
        stage,
        f"{size_text(needed / GiB)} GiB of GPU memory for the target's {what}",
        there + (f" ({held})" if held else ""),
        fix,
    )
