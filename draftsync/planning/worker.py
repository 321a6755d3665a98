"""The machine a sync runs on, as a plan counts it: its GPUs and what serving already holds there, host memory, disk,
and the units a plan states them in."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GiB = 1024**3
GPU_RESERVE_GIB = 2.0  # per GPU: the CUDA context, the allocator's slack and fragmentation
HOST_RESERVE_GIB = 1.0  # kept free for the worker's own processes beside what the plan counts
# The first vLLM release with the `extract_hidden_states` speculative method (vLLM PR #33736, released in 0.18.0;
# the installed 0.32.0 has it in vllm/config/speculative.py).
EXTRACT_HIDDEN_STATES_SINCE = (0, 18, 0)
NO_VLLM = "none"  # what `--vllm-version` takes for a worker without vLLM


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
    vllm_version: str | None = None  # the vLLM the sync's servers run (e.g. "0.32.0"); None: no vLLM there

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


def vllm_release(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a vLLM version such as 0.32.0, 0.18.0rc1 or 0.32.0+cpu; None when it is not one."""
    found = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-]?\w[\w.+-]*)?", version.strip())
    if found is None:
        return None
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch or 0)


def size_text(gib: float) -> str:
    """GiB as a person reads them: 2,453 / 16.3 / 0.00093."""
    if gib >= 100:
        return f"{gib:,.0f}"
    return f"{gib:.1f}" if gib >= 1 else f"{gib:.2g}"


def gib(value: float) -> float:
    """Bytes as GiB, rounded for a plan's tables."""
    return round(value / GiB, 2)


def detect_worker(
    root: Path,
    held: tuple[HeldMemory, ...] = (),
    vllm_version: str | None = None,
    installed_vllm: Callable[[], str | None] | None = None,
    **given: float | None,
) -> Worker:
    """The worker's figures: those `given` (not None) as they are, the rest read from this machine. `vllm_version`:
    the servers' vLLM ("none": no vLLM); None asks `installed_vllm` for the engine this machine would start (the
    serving layer knows it: `serving.vllm_engine.installed_vllm_version`)."""
    detected: list[str] = []
    if vllm_version is None and installed_vllm is not None:
        vllm_version, detected = installed_vllm(), ["vllm_version"]
    elif vllm_version is not None and vllm_version.strip().lower() == NO_VLLM:
        vllm_version = None
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
    return Worker(
        int(gpus), float(memory or 0.0), float(host), float(disk), held, tuple(detected), vllm_version=vllm_version
    )


def _available_host_memory() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    import os

    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
