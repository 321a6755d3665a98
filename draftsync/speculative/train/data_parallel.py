"""Data-parallel training under torchrun: one code path for one process and for n, gloo on a CPU, NCCL on GPUs.

Each rank trains on its slice of every step's global batch. A micro-batch's loss weighs its share of the loss-masked
tokens of the whole global batch, times the world size (the ranks' average undoes it), so n ranks take the step one
process takes at the same global batch. Two ways to hold the drafter (`REPLICAS`):
- `ddp`: every rank holds the whole drafter and AdamW's state; DistributedDataParallel averages the gradients once a
  step;
- `fsdp`: FSDP2 (`fully_shard`) keeps each rank's 1/n of the weights, gradients and AdamW's state between passes and
  gathers the weights for each forward and backward, for a drafter whose optimiser does not fit one GPU. Every
  micro-batch is a collective there, so the ranks run as many as the busiest of them.
Checkpoints hold the whole drafter and optimiser, in one format for both, so a run resumes on another world size and
the other way of holding it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError

if TYPE_CHECKING:
    import torch

# How long a rank waits at a collective: the leader alone writes each checkpoint (tens of GB for a large drafter's
# state and AdamW's) while the others wait at the next one. Joining is bounded apart, by torchrun's join timeout.
COLLECTIVE_TIMEOUT = timedelta(minutes=60)


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
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
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


DDP = "ddp"
FSDP = "fsdp"
REPLICAS = (DDP, FSDP)


class Replica:
    """The drafter's training loss behind DDP or FSDP2: what the step calls instead of `drafter.training_loss`."""

    def __init__(self, drafter: Any, device: torch.device, kind: str):
        import torch

        if kind not in REPLICAS:
            raise DraftsyncError(f"data-parallel kind {kind!r} is not known", f"use one of {list(REPLICAS)}")

        class TrainingLoss(torch.nn.Module):
            """DDP and FSDP act around a module's forward; a drafter's training pass is its `training_loss`."""

            def __init__(self, inner: Any):
                super().__init__()
                self.inner = inner

            def forward(self, *args: Any, **kwargs: Any) -> Any:
                return self.inner.training_loss(*args, **kwargs)

        self.kind = kind
        self.sharded = kind == FSDP
        self.module: Any
        if self.sharded:
            from torch.distributed.fsdp import fully_shard

            self.module = fully_shard(TrainingLoss(drafter))
        else:
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [device.index] if device.type == "cuda" else None
            self.module = DistributedDataParallel(TrainingLoss(drafter), device_ids=device_ids)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def accumulating(self, last: bool) -> Any:
        """The context of one micro-batch's backward: the ranks' gradients are combined at the step's last only."""
        if self.sharded:
            self.module.set_requires_gradient_sync(last)
            return nullcontext()
        return nullcontext() if last else self.module.no_sync()

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """The drafter's whole weights on every rank for a while (evaluation): a no-op when each rank holds them."""
        if not self.sharded:
            yield
            return
        self.module.unshard()
        try:
            yield
        finally:
            self.module.reshard()


def whole_state(drafter: Any, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The drafter's and the optimiser's state dicts with every sharded tensor gathered whole, in the format one
    process writes. A collective under FSDP: every rank calls it."""
    from torch.distributed.tensor import DTensor

    def whole(value: Any) -> Any:
        return value.full_tensor() if isinstance(value, DTensor) else value

    model = {name: whole(value) for name, value in drafter.state_dict().items()}
    optim = optimizer.state_dict()
    optim["state"] = {key: {k: whole(v) for k, v in entry.items()} for key, entry in optim["state"].items()}
    return model, optim


def load_optimizer_state(optimizer: Any, state: dict[str, Any], parameters: list[Any]) -> None:
    """A whole optimiser state (`whole_state`'s) into an optimiser over `parameters`, each moment cut to its
    parameter's shard where the parameters are sharded."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    entries = {}
    for key, entry in state["state"].items():
        parameter = parameters[int(key)]
        if isinstance(parameter, DTensor):
            entry = {
                k: distribute_tensor(v.to(parameter.device), parameter.device_mesh, parameter.placements)
                if hasattr(v, "shape") and tuple(v.shape) == tuple(parameter.shape)
                else v
                for k, v in entry.items()
            }
        entries[key] = entry
    optimizer.load_state_dict({**state, "state": entries})


def summed(values: list[float], ranks: Ranks) -> list[float]:
    """Each value summed over the ranks (itself in one process)."""
    return _reduced(values, ranks, "SUM")


def most(value: int, ranks: Ranks) -> int:
    """The largest of the ranks' values (its own in one process)."""
    return int(_reduced([float(value)], ranks, "MAX")[0])


def _reduced(values: list[float], ranks: Ranks, how: str) -> list[float]:
    if not ranks.distributed:
        return values
    import torch
    import torch.distributed as dist

    total = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        total = total.cuda()
    dist.all_reduce(total, op=getattr(dist.ReduceOp, how))
    return [float(value) for value in total.cpu()]
