"""Where a sync's target runs, and one loaded copy of it per sync.

On a CPU the target runs in fp32 (bf16 matmuls are not faster there for its forward passes). On a GPU it runs in its
checkpoint's 16-bit dtype (bf16 when the checkpoint is fp32), on one GPU when it fits, else spread over several by
accelerate's device_map within the memory the plan leaves it. The dataset and the training of one sync read the same
loaded copy (`shared_target`); the sync releases it when it ends.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError

if TYPE_CHECKING:
    import torch

CPU = "cpu"


@dataclass(frozen=True)
class TargetPlacement:
    """The devices a target is loaded on: ("cpu",), ("cuda:0",), or several GPUs for a device_map."""

    devices: tuple[str, ...] = (CPU,)
    max_memory_gib: float | None = None  # per GPU of a device_map: what the plan leaves the target

    @property
    def on_gpu(self) -> bool:
        return self.devices[0].startswith("cuda")


def placement_dtype(config: dict[str, Any], placement: TargetPlacement) -> torch.dtype:
    """fp32 on the CPU; on a GPU the checkpoint's fp16 or bf16, and bf16 for an fp32 checkpoint."""
    import torch

    if not placement.on_gpu:
        return torch.float32
    declared = str(config.get("dtype") or config.get("torch_dtype") or "")
    return torch.float16 if declared == "float16" else torch.bfloat16


def from_pretrained_options(config: dict[str, Any], placement: TargetPlacement) -> dict[str, Any]:
    """transformers' `from_pretrained` keywords that put the target where `placement` says."""
    dtype = placement_dtype(config, placement)
    if not placement.on_gpu:
        return {"dtype": dtype}
    if len(placement.devices) == 1:
        return {"dtype": dtype, "device_map": {"": placement.devices[0]}}
    budget = f"{placement.max_memory_gib:.1f}GiB" if placement.max_memory_gib else None
    indices = [int(device.split(":")[1]) for device in placement.devices]
    options: dict[str, Any] = {"dtype": dtype, "device_map": "auto"}
    if budget is not None:
        options["max_memory"] = {index: budget for index in indices}
    return options


_lock = threading.Lock()
_shared: dict[tuple[str, TargetPlacement], tuple[Any, Any]] = {}


def shared_target(path: Path, placement: TargetPlacement | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) of the target at `path`, loaded once and kept until `release_shared_targets`."""
    from draftsync.speculative.target_description import read_target_config
    from draftsync.speculative.targets import load_target

    key = (str(Path(path).resolve()), placement or TargetPlacement())
    with _lock:
        if key not in _shared:
            _shared.clear()  # one target at a time: a second would double the memory a plan counted once
            options = from_pretrained_options(read_target_config(Path(path)), key[1])
            _shared[key] = load_target(Path(path), load_options=options)
        return _shared[key]


def drop_decoder_layers(model: Any) -> None:
    """Free a GPU target's decoder layers once its states are written: training reads only its lm_head, embedding
    and final norm. Its fingerprint is kept first (the dataset is checked against it), and the shared copy is
    released, so nothing later reads the reduced model as the whole target."""
    import torch

    from draftsync.speculative.targets import without_decoder_layers

    without_decoder_layers(model)
    with _lock:
        for key, (shared, _) in list(_shared.items()):
            if shared is model:
                del _shared[key]
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def release_shared_targets() -> None:
    """Drop the loaded target, and the GPU memory it held."""
    with _lock:
        _shared.clear()
    import gc

    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def visible_devices(devices: Sequence[int], parent: Mapping[str, str], holder: str = "a vLLM server") -> str:
    """CUDA_VISIBLE_DEVICES for a child process (`holder`: a vLLM server, the training ranks) on the plan's `devices`,
    which count inside the parent's visible set (a worker given GPUs 4-7 by its scheduler sees them as 0-3): device i
    is the parent's i-th entry (an index, a GPU UUID or a MIG id, kept as written). With CUDA_VISIBLE_DEVICES unset
    the indices are the machine's own."""
    planned = ",".join(str(d) for d in devices)
    if "CUDA_VISIBLE_DEVICES" not in parent:
        return planned
    value = parent["CUDA_VISIBLE_DEVICES"]
    visible: list[str] = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry or entry.startswith("-"):  # CUDA stops at an invalid entry: "-1" hides every GPU
            break
        visible.append(entry)
    if any(not 0 <= d < len(visible) for d in devices):
        count = f"{len(visible)} GPU{'' if len(visible) == 1 else 's'}" if visible else "no GPU"
        shown = value or '""'
        raise DraftsyncError(
            f"the sync's plan puts {holder} on GPUs {planned} but this worker's CUDA_VISIBLE_DEVICES={shown} "
            f"names {count}",
            "give the worker the GPUs the plan was made for (its scheduler sets CUDA_VISIBLE_DEVICES), or plan the "
            "sync again on this worker",
        )
    return ",".join(visible[d] for d in devices)
