"""The machine a sync runs on, as a plan counts it: its GPUs and what serving already holds there, host memory, disk,
and the units a plan states them in."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

GiB = 1024**3
GPU_RESERVE_GIB = 2.0  # per GPU: the CUDA context, the allocator's slack and fragmentation
HOST_RESERVE_GIB = 1.0  # kept free for the worker's own processes beside what the plan counts


@dataclass(frozen=True)
class HeldMemory:
    """GPU memory a serving deployment on this worker holds: `gib` on each of GPUs 0..gpus-1."""

    deployment: str
    gpus: int
    gib: float


@dataclass(frozen=True)
class Worker:
    """The machine a sync runs on; `detected` names the figures read from it rather than given. GPU numbers count
    inside the worker's own visible set (CUDA_VISIBLE_DEVICES), from 0."""

    gpus: int
    gpu_memory_gib: float
    host_memory_gib: float
    disk_gib: float
    held: tuple[HeldMemory, ...] = ()
    detected: tuple[str, ...] = ()
    nodes: int = 1  # machines like this one that training may span (torchrun's c10d rendezvous); the rest runs on one

    def free_gib(self, gpu: int) -> float:
        """What GPU `gpu` leaves a sync: its memory less what serving holds there and the reserve."""
        return self.gpu_memory_gib - self.held_gib(gpu) - GPU_RESERVE_GIB

    def held_gib(self, gpu: int) -> float:
        return sum(h.gib for h in self.holders(gpu))

    def holders(self, gpu: int) -> list[HeldMemory]:
        return [h for h in self.held if gpu < h.gpus]

    def freest(self) -> list[int]:
        """The GPUs, the one with the most room first (ties in index order)."""
        return sorted(range(self.gpus), key=self.free_gib, reverse=True)


def size_text(gib: float) -> str:
    """GiB as a person reads them: 2,453 / 16.3 / 0.00093."""
    if gib >= 100:
        return f"{gib:,.0f}"
    return f"{gib:.1f}" if gib >= 1 else f"{gib:.2g}"


def gib(value: float) -> float:
    """Bytes as GiB, rounded for a plan's tables."""
    return round(value / GiB, 2)


def detect_worker(root: Path, held: tuple[HeldMemory, ...] = (), **given: float | None) -> Worker:
    """The worker's figures: those `given` (not None) as they are, the rest read from this machine."""
    detected: list[str] = []
    gpus = given.get("gpus")
    memory = given.get("gpu_memory_gib")
    if gpus is None or (gpus and memory is None):
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus is None:
            gpus, detected = count, [*detected, "gpus"]
        if gpus and memory is None:
            memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(count)) / GiB
            detected.append("gpu_memory_gib")
    host = given.get("host_memory_gib")
    if host is None:
        host, detected = _available_host_memory() / GiB, [*detected, "host_memory_gib"]
    disk = given.get("disk_gib")
    if disk is None:
        existing = next(p for p in (root, *root.parents) if p.exists())
        disk, detected = shutil.disk_usage(existing).free / GiB, [*detected, "disk_gib"]
    return Worker(int(gpus), float(memory or 0.0), float(host), float(disk), held, tuple(detected))


def _available_host_memory() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    import os

    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
