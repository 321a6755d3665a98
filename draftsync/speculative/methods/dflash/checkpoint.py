"""DFlash drafters on disk, in the layout vLLM's `DFlashDraftModel` loads (model_executor/models/qwen3_dflash.py).

A directory holds `config.json` and `model.safetensors` (bf16).

config.json fields vLLM reads: `architectures` ["DFlashDraftModel"], `model_type` "qwen3" and the draft layers' Qwen3
shape (`num_hidden_layers` of them), `block_size`, and `dflash_config` with `mask_token_id` (the id of the masked
block rows) and `target_layer_ids`. vLLM names a target layer by its output, so `target_layer_ids` are draftsync's
aux layer ids (the input of layer k) minus one. draftsync's own, which vLLM keeps as plain attributes:
`draftsync_drafter` (the method's name), `max_draft_tokens` (block_size - 1: the most a block drafts),
`target_hidden_size`, `speculative_tokens` (the gamma it was validated at) and `verifier`.

model.safetensors holds vLLM's names: `fc`, `hidden_norm`, `norm`, `layers.{i}.self_attn.{q,k,v,o}_proj`, its
`q_norm`/`k_norm`, `layers.{i}.mlp.{gate,up,down}_proj`, the layer norms, and the target's own `embed_tokens` and
`lm_head` (frozen copies; vLLM serves a checkpoint's own copy as it would the target's).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import DFLASH
from draftsync.speculative.methods.checkpoint_files import (
    CONFIG_FILE,
    SavedFor,
    bf16_tensors,
    check_tensors,
    config_value,
    read_json,
    read_safetensors,
    write_directory,
)

if TYPE_CHECKING:
    import torch

    from draftsync.speculative.methods.dflash.model import DFlashConfig, DFlashDrafter

WEIGHTS_FILE = "model.safetensors"
ARCHITECTURE = "DFlashDraftModel"


def dflash_config(drafter: DFlashDrafter, saved_for: SavedFor) -> dict[str, Any]:
    """The whole config.json of a DFlash drafter directory."""
    import transformers

    config = drafter.config
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "draftsync_drafter": DFLASH.name,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "target_hidden_size": config.target_hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": config.rope_parameters(),
        "attention_bias": False,
        "tie_word_embeddings": False,
        "block_size": config.block_size,
        "max_draft_tokens": config.max_draft_tokens,
        "dflash_config": {
            "mask_token_id": config.mask_token_id,
            "target_layer_ids": [k - 1 for k in config.aux_layer_ids],
        },
        "speculative_tokens": saved_for.speculative_tokens,
        "verifier": saved_for.verifier(),
        "torch_dtype": "bfloat16",
        "transformers_version": transformers.__version__,
    }


def save_dflash(drafter: DFlashDrafter, out_dir: str | Path, saved_for: SavedFor) -> Path:
    """Write the drafter to `out_dir` (created; files replaced atomically) and return the directory."""
    if saved_for.speculative_tokens > drafter.config.max_draft_tokens:
        raise DraftsyncError(
            f"gamma {saved_for.speculative_tokens} was recorded for a DFlash drafter whose blocks draft at most "
            f"{drafter.config.max_draft_tokens} tokens",
            f"record a gamma of at most {drafter.config.max_draft_tokens}, or train with a larger block_size",
        )
    return write_directory(
        out_dir, {WEIGHTS_FILE: bf16_tensors(drafter.state_dict())}, {CONFIG_FILE: dflash_config(drafter, saved_for)}
    )


def _drafter_config(config: dict[str, Any], path: Path) -> DFlashConfig:
    from draftsync.speculative.families import rope_scaling_of
    from draftsync.speculative.methods.dflash.model import DFlashConfig

    rope = config.get("rope_parameters") or {}
    hidden = config_value(config, path, "hidden_size")
    heads = config_value(config, path, "num_attention_heads")
    return DFlashConfig(
        hidden_size=hidden,
        target_hidden_size=config.get("target_hidden_size") or hidden,
        vocab_size=config_value(config, path, "vocab_size"),
        draft_vocab_size=config_value(config, path, "vocab_size"),
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        intermediate_size=config_value(config, path, "intermediate_size"),
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        rope_scaling=rope_scaling_of(rope or config.get("rope_scaling")),
        aux_layer_ids=tuple(k + 1 for k in config_value(config, path, "dflash_config", "target_layer_ids")),
        num_hidden_layers=config_value(config, path, "num_hidden_layers"),
        block_size=config_value(config, path, "block_size"),
        mask_token_id=config_value(config, path, "dflash_config", "mask_token_id"),
    )


def load_dflash(directory: str | Path, dtype: torch.dtype | None = None) -> DFlashDrafter:
    """Read a drafter written by save_dflash into a DFlashDrafter (float32 unless `dtype` says otherwise)."""
    import torch

    from draftsync.speculative.methods.dflash.model import DFlashDrafter

    path, config = read_json(directory)
    if config.get("draftsync_drafter") != DFLASH.name:
        raise DraftsyncError(
            f"{path} has draftsync_drafter {config.get('draftsync_drafter')!r}, not {DFLASH.name!r}",
            "load a DFlash drafter saved by save_drafter",
        )
    drafter = DFlashDrafter(_drafter_config(config, path))
    weights_path = Path(directory) / WEIGHTS_FILE
    expected = drafter.state_dict()
    tensors = read_safetensors(weights_path)
    check_tensors(tensors, expected, str(weights_path))
    drafter.load_state_dict(tensors, strict=True)
    return drafter.to(dtype or torch.float32).eval()
