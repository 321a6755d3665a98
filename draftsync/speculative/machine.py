"""What this machine is and can do, worked out once and kept in the user's cache.

Whether bf16 autocast trains faster than fp32 depends on the CPU, not on its flags alone (bench/train_precision.py
and docs/TRAINING.md: faster with AMX, slower on a CPU with AVX512-BF16 but no AMX). So the choice is measured on the
CPU itself, once, and the answer is kept: every process on the machine then trains in the same precision, and a
built-in target cached under one precision is found again by the next process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from draftsync.errors import DraftsyncError
from draftsync.files import atomic_write

if TYPE_CHECKING:
    import torch

# bf16 must be at least this much faster to be chosen: a CPU near 1.0 stays on fp32 whatever the noise of the probe.
BF16_MIN_SPEEDUP = 1.1
# Raise when the probe below changes, so that no answer of an older probe is read.
PROBE_VERSION = 1


def user_cache_dir() -> Path:
    """draftsync's directory in the user's cache (XDG_CACHE_HOME, else ~/.cache): what holds for the whole machine."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "draftsync"


def trains_in_bf16(precision: str, device: torch.device) -> bool:
    """Whether to train under bf16 autocast: the weights and optimiser stay fp32, the matmuls run in bf16.

    `auto` takes bf16 on CUDA, and on a CPU whose oneDNN multiplies bf16 natively and where a measured training step
    is at least BF16_MIN_SPEEDUP faster in bf16 (cpu_bf16_speedup); fp32 everywhere else."""
    import torch

    if precision not in ("auto", "bf16", "fp32"):
        raise DraftsyncError(f"training precision {precision!r} is not known", "use auto, bf16 or fp32")
    if precision != "auto":
        return precision == "bf16"
    if device.type == "cuda":
        return True
    if device.type != "cpu" or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    return cpu_bf16_speedup() >= BF16_MIN_SPEEDUP


@functools.lru_cache(maxsize=1)
def cpu_bf16_speedup() -> float:
    """fp32 time over bf16-autocast time of a training step on this CPU: from the user's cache, else measured
    (about 2 s on 2 cores) and stored there."""
    cpu = _cpu_identity()
    key = hashlib.sha256(f"{PROBE_VERSION}|{cpu}".encode()).hexdigest()[:16]
    cache = user_cache_dir() / f"cpu-bf16-speedup-{key}.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return float(json.loads(cache.read_text())["fp32_over_bf16"])
    ratio = _measure_bf16_speedup()
    cache.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(cache, lambda tmp: tmp.write_text(json.dumps({"fp32_over_bf16": ratio, "cpu": cpu}) + "\n"))
    return ratio


# The vector extensions a CPU training figure depends on: /proc/cpuinfo's flag, then the name a reader knows.
VECTOR_EXTENSIONS = {
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_bf16": "AVX512-BF16",
    "amx_tile": "AMX",
}


def _cpuinfo() -> dict[str, str]:
    """The first processor's `model name` and `flags` from /proc/cpuinfo (Linux); empty elsewhere."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() in ("model name", "flags") and name.strip() not in fields:
                fields[name.strip()] = value.strip()
    return fields


def machine_record() -> dict:
    """The CPU a time was measured on: its model, the cores this process may use and its vector extensions (torch
    trains several times slower without AVX-512), so that no figure is read without its machine."""
    fields = _cpuinfo()
    flags = set(fields.get("flags", "").split())
    return {
        "cpu_model": fields.get("model name") or platform.processor() or platform.machine(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "vector_extensions": [name for flag, name in VECTOR_EXTENSIONS.items() if flag in flags],
    }


def _cpu_identity() -> str:
    """The CPU's model and instruction-set flags (Linux), else what the platform module knows, and torch's version.

    Not the thread count: one answer holds for every process on the machine, whatever threads each one runs."""
    import torch

    fields = _cpuinfo()
    model = fields.get("model name") or platform.processor() or platform.machine()
    return f"{model}|{fields.get('flags', '')}|torch {torch.__version__}"


def _measure_bf16_speedup(rounds: int = 5) -> float:
    """Median seconds of a training step (forward and backward) of a small transformer-sized MLP, fp32 over bf16
    autocast, the two alternating so that a burst of load falls on both."""
    import torch

    generator = torch.Generator().manual_seed(0)
    width, inner, rows = 256, 704, 2048  # the demo target's hidden and MLP sizes, one batch of its tokens
    weights = [
        (torch.randn(shape, generator=generator) * 0.05).requires_grad_()
        for shape in ((inner, width), (width, inner), (inner, width), (width, inner))
    ]
    inputs = torch.randn(rows, width, generator=generator)

    def step(bf16: bool) -> float:
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden = inputs
            for up, down in zip(weights[::2], weights[1::2], strict=True):
                hidden = hidden + torch.nn.functional.linear(torch.nn.functional.silu(hidden @ up.T), down)
        hidden.float().pow(2).mean().backward()
        return time.perf_counter() - started

    seconds: dict[bool, list[float]] = {False: [], True: []}
    step(False), step(True)  # warm-up: oneDNN picks its kernels on first use
    for _ in range(rounds):
        for bf16 in (False, True):
            seconds[bf16].append(step(bf16))
    return round(statistics.median(seconds[False]) / statistics.median(seconds[True]), 3)
