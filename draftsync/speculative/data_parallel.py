"""Data-parallel training under torchrun: one code path for one process and for n, gloo on a CPU, NCCL on GPUs.

Each rank trains on its slice of every step's global batch, and DistributedDataParallel averages the gradients. A
micro-batch's loss weighs its share of the loss-masked tokens of the whole global batch, times the world size (the
average undoes it), so n ranks take the step one process takes at the same global batch. Checkpoints hold the
unwrapped drafter and its optimiser, the same on every rank, so a run resumes on another world size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError

if TYPE_CHECKING:
    import torch

RENDEZVOUS_TIMEOUT = timedelta(minutes=5)  # every rank of a job must join within this, or each fails naming the store


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job: torchrun's RANK, WORLD_SIZE and LOCAL_RANK (one process: 0, 1, 0)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_environment(cls) -> Ranks:
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        )

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def leader(self) -> bool:
        """The rank that writes checkpoints and the trained drafter."""
        return self.rank == 0

    def device_name(self, configured: str) -> str:
        """Each rank on its own GPU (LOCAL_RANK); a CPU stays a CPU."""
        import torch

        wants_cuda = configured.startswith("cuda") or (configured == "auto" and torch.cuda.is_available())
        return f"cuda:{self.local_rank}" if wants_cuda else "cpu"

    def slice(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's share of a step's rows: every world_size-th, from its rank."""
        return rows[self.rank :: self.world_size]


ONE_PROCESS = Ranks()


def start(ranks: Ranks, device: torch.device) -> None:
    """Join the job's process group (NCCL on GPUs, gloo on CPUs) through torchrun's rendezvous environment."""
    import torch.distributed as dist

    if not ranks.distributed or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        import torch

        torch.cuda.set_device(device)
    endpoint = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    try:
        dist.init_process_group(backend, timeout=RENDEZVOUS_TIMEOUT)
    except Exception as error:  # the store unreachable, a rank missing, a timeout: all end the same way
        raise DraftsyncError(
            f"rank {ranks.rank} of {ranks.world_size} could not join the training job at {endpoint} "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})",
            "check that every node reaches the rendezvous endpoint (torchrun --rdzv-endpoint) and that all ranks start",
        ) from error


def stop() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def replicate(drafter: Any, device: torch.device) -> Any:
    """The drafter's training loss behind DistributedDataParallel, which averages its gradients over the ranks."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    class TrainingLoss(torch.nn.Module):
        """DDP syncs what a module's forward computes; a drafter's training pass is its `training_loss`."""

        def __init__(self, inner: Any):
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.inner.training_loss(*args, **kwargs)

    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(TrainingLoss(drafter), device_ids=device_ids)


def summed(values: list[float], ranks: Ranks) -> list[float]:
    """Each value summed over the ranks (itself in one process)."""
    if not ranks.distributed:
        return values
    import torch
    import torch.distributed as dist

    total = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        total = total.cuda()
    dist.all_reduce(total)
    return [float(value) for value in total.cpu()]
