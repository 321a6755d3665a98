"""How a vLLM server hands a target's hidden states over: the `extract_hidden_states` speculative method and the
hidden-states connector draftsync ships with its vLLM plugin (deploy/vllm-cpu-plugin/draftsync_hidden_states.py).

The model caches the residual stream at the requested layers (vLLM's layer k is the input of decoder layer k,
draftsync's aux id k; k = L is the last layer's output, before the final norm), and the connector writes each finished
request's states to a safetensors file (`hidden_states` [tokens, layers, hidden], `token_ids`) under its storage path,
holding a `.lock` beside it until the file is whole. The sync's own reader (serving/vllm_states.py) and speculators'
data generation (`trainer: speculators`) both start their servers with these settings.
"""

from __future__ import annotations

import fcntl
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

CONNECTOR_MODULE = "draftsync_hidden_states"  # installed into the engine's venv with the plugin (`make vllm`)
CONNECTOR_CLASS = "DraftsyncHiddenStatesConnector"


def captured_layer_ids(aux_layer_ids: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """The layers the server caches: the aux ids and the last layer's output, in vLLM's order (sorted, once each)."""
    return tuple(sorted({*map(int, aux_layer_ids), num_layers}))


def extract_hidden_states_config(layer_ids: Sequence[int]) -> dict[str, Any]:
    """vLLM's `--speculative-config` for a server that caches the states of `layer_ids` (the last one included)."""
    return {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
    }


def hidden_states_connector_config(storage_dir: str | Path) -> dict[str, Any]:
    """vLLM's `--kv-transfer-config`: draftsync's connector, writing one file per request under `storage_dir`."""
    return {
        "kv_connector": CONNECTOR_CLASS,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(storage_dir)},
    }


def read_states_file(path: Path) -> dict[str, torch.Tensor]:
    """The connector's file, read once its writer has released the `.lock` beside it (a shared lock waits for it)."""
    from safetensors.torch import load_file

    lock = Path(f"{path}.lock")
    if lock.exists():
        with open(lock) as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
            return load_file(str(path), device="cpu")
    return load_file(str(path), device="cpu")
