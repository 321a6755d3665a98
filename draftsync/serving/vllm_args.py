"""The `vllm serve` command line a GPU worker runs for a target and its drafter.

The long form is used: `vllm serve <target dir> --speculative-config '<json>'`. vLLM's short form
(serving the drafter directory alone) only works when the drafter's verifier is a hub id, and our
targets are local checkpoint directories.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from draftsync.errors import DraftsyncError

DrafterMethod = Literal["eagle3", "eagle3.1", "eagle"]

# EAGLE 3.1 checkpoints are eagle3 checkpoints with extra norms that vLLM reads from their config.
_VLLM_METHOD = {"eagle3": "eagle3", "eagle3.1": "eagle3", "eagle": "eagle"}


@dataclass(frozen=True)
class VllmLaunch:
    """An argument list (never a shell string) and the speculative config it carries, for the record."""

    argv: list[str]
    speculative_config: dict | None

    def as_record(self) -> dict:
        return {"argv": self.argv, "speculative_config": self.speculative_config}


def render_vllm_command(
    target_dir: Path | str,
    drafter_dir: Path | str | None,
    method: DrafterMethod,
    gamma: int,
    host: str,
    port: int,
    served_model_name: str,
    tensor_parallel_size: int = 1,
    extra_args: Sequence[str] = (),
) -> VllmLaunch:
    """Render the launch; without a drafter the target is served with speculation off."""
    if tensor_parallel_size < 1:
        raise DraftsyncError(
            f"tensor_parallel_size {tensor_parallel_size} is below 1", "pass the number of GPUs per replica"
        )
    argv = [
        "vllm",
        "serve",
        str(target_dir),
        "--host",
        host,
        "--port",
        str(int(port)),
        "--served-model-name",
        served_model_name,
    ]
    if tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(tensor_parallel_size)]
    speculative_config = None
    if drafter_dir is not None:
        if method not in _VLLM_METHOD:
            raise DraftsyncError(
                f"drafter method {method!r} cannot be served by vLLM",
                f"use one of {', '.join(_VLLM_METHOD)} (vLLM has no medusa support); serve the target alone",
            )
        if int(gamma) < 1:
            raise DraftsyncError(f"gamma {gamma} is below 1", "pass the number of speculative tokens (>= 1)")
        speculative_config = {
            "method": _VLLM_METHOD[method],
            "model": str(drafter_dir),
            "num_speculative_tokens": int(gamma),
        }
        if tensor_parallel_size > 1:
            speculative_config["draft_tensor_parallel_size"] = tensor_parallel_size
        argv += ["--speculative-config", json.dumps(speculative_config)]
    argv += list(extra_args)
    return VllmLaunch(argv=argv, speculative_config=speculative_config)
