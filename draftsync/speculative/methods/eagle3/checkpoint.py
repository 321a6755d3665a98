"""EAGLE-3 drafters on disk in the speculators format, which vLLM recognises without extra flags.

A directory holds `config.json` (speculators_model_type the EAGLE-3 family's, the speculators_config with the
verifier, the draft layer's Llama config, draft vocabulary size, aux layer ids and norm flags) and
`model.safetensors` (bf16 weights under the speculators/vLLM names; d2t int64 and t2d bool as they are).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import EAGLE3
from draftsync.speculative.methods.checkpoint_files import (
    CONFIG_FILE,
    SavedFor,
    bf16_tensors,
    check_tensors,
    read_json,
    read_safetensors,
    write_directory,
)

if TYPE_CHECKING:
    import torch

    from draftsync.speculative.methods.eagle1.model import EagleDrafter
    from draftsync.speculative.methods.eagle3.model import Eagle3Drafter

WEIGHTS_FILE = "model.safetensors"
SPECULATORS_VERSION = "0.9.0"  # the speculators release whose eagle3 config schema this file follows
ARCHITECTURE = "Eagle3DraftModel"


def transformer_layer_config(drafter: Eagle3Drafter | EagleDrafter) -> dict[str, Any]:
    """The draft decoder layer (EAGLE-3's or EAGLE-1's) as a Llama config; `vocab_size` is the target's."""
    config = drafter.config
    return {
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": config.rope_parameters(),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        # The target's window, which vLLM applies to the draft layer too (written only where there is one).
        **({"sliding_window": config.sliding_window} if config.sliding_window else {}),
    }


def speculators_config(drafter: Eagle3Drafter, saved_for: SavedFor) -> dict[str, Any]:
    """The whole config.json of a drafter directory."""
    import transformers

    config = drafter.config
    return {
        "architectures": [ARCHITECTURE],
        "speculators_model_type": EAGLE3.speculators_type,
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": EAGLE3.speculators_type,
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": saved_for.speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": saved_for.verifier(),
        },
        "transformer_layer_config": transformer_layer_config(drafter),
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(config.aux_layer_ids),
        "norm_before_residual": config.norm_before_residual,
        "norm_before_fc": config.norm_before_fc,
        "fc_norm": config.fc_norm,
        "norm_output": config.norm_output,
        "embed_requires_grad": False,
        "torch_dtype": "bfloat16",
        "transformers_version": transformers.__version__,
    }


def save_eagle3(drafter: Eagle3Drafter, out_dir: str | Path, saved_for: SavedFor) -> Path:
    """Write the drafter to `out_dir` (created; files replaced atomically) and return the directory."""
    config = speculators_config(drafter, saved_for)
    return write_directory(out_dir, {WEIGHTS_FILE: bf16_tensors(drafter.state_dict())}, {CONFIG_FILE: config})


def read_config(directory: str | Path) -> dict[str, Any]:
    """config.json of a drafter directory, checked to be a speculators eagle3 config."""
    config_path, config = read_json(directory)
    if config.get("speculators_model_type") != EAGLE3.speculators_type:
        found = config.get("speculators_model_type")
        raise DraftsyncError(
            f"{config_path} has speculators_model_type {found!r}, not {EAGLE3.speculators_type!r}",
            "load an EAGLE-3 drafter saved in the speculators format",
        )
    return config


def _drafter_config(config: dict[str, Any], config_path: Path):
    from draftsync.speculative.families import rope_scaling_of
    from draftsync.speculative.methods.eagle3.model import Eagle3Config

    try:
        layer = config["transformer_layer_config"]
        rope = layer.get("rope_parameters") or {}
        layers = int(layer.get("num_hidden_layers", 1))
        kinds = set(layer.get("layer_types") or ["full_attention"])
        if layers != 1 or kinds != {"full_attention"}:
            raise DraftsyncError(
                f"{config_path} describes {layers} draft layer(s) of type {sorted(kinds)}; draftsync's EAGLE-3 "
                "drafter is one full-attention layer, and reading it as such would silently drop weights",
                "train with one full-attention layer (speculators train --num-layers 1 --full-attention-indices 0),"
                " or serve this drafter with vLLM directly",
            )
        return Eagle3Config(
            hidden_size=layer["hidden_size"],
            target_hidden_size=config.get("target_hidden_size") or layer["hidden_size"],
            vocab_size=layer["vocab_size"],
            draft_vocab_size=config.get("draft_vocab_size") or layer["vocab_size"],
            num_attention_heads=layer["num_attention_heads"],
            num_key_value_heads=layer.get("num_key_value_heads") or layer["num_attention_heads"],
            head_dim=layer.get("head_dim") or layer["hidden_size"] // layer["num_attention_heads"],
            intermediate_size=layer["intermediate_size"],
            rms_norm_eps=layer.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", layer.get("rope_theta", 10000.0)),
            max_position_embeddings=layer.get("max_position_embeddings", 2048),
            rope_scaling=rope_scaling_of(rope or layer.get("rope_scaling")),
            sliding_window=layer.get("sliding_window"),
            aux_layer_ids=tuple(config["eagle_aux_hidden_state_layer_ids"]),
            # vLLM reads a missing norm_before_residual as True.
            norm_before_residual=bool(config.get("norm_before_residual", True)),
            fc_norm=bool(config.get("fc_norm", False)),
            norm_output=bool(config.get("norm_output", False)),
            norm_before_fc=bool(config.get("norm_before_fc", False)),
        )
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise DraftsyncError(
            f"{config_path} lacks a field an EAGLE-3 drafter needs ({error})", "re-save the drafter with save_eagle3"
        ) from error


def load_eagle3(directory: str | Path, dtype: torch.dtype | None = None) -> Eagle3Drafter:
    """Read a drafter written by save_eagle3 (or by speculators) into an Eagle3Drafter (float32 default)."""
    import torch

    from draftsync.speculative.methods.eagle3.model import Eagle3Drafter

    path = Path(directory)
    config = read_config(path)
    drafter = Eagle3Drafter(_drafter_config(config, path / CONFIG_FILE))
    weights_path = path / WEIGHTS_FILE
    expected = drafter.state_dict()
    # Tensors the drafter has no place for are left out, not refused: checkpoints written elsewhere may hold more.
    tensors = {name: tensor for name, tensor in read_safetensors(weights_path).items() if name in expected}
    check_tensors(tensors, expected, str(weights_path))
    drafter.load_state_dict(tensors, strict=True)
    return drafter.to(dtype or torch.float32).eval()
