"""EAGLE-1 drafters on disk in the layout vLLM's EAGLE method loads without conversion.

A directory holds:
- `config.json`: a one-layer Llama config (`model_type` "llama", `architectures` ["LlamaForCausalLM"], which
  vLLM renames EagleLlamaForCausalLM for its EAGLE method; `vocab_size` is the target's) plus our own
  `draftsync_*` fields (drafter kind, verifier, speculative tokens, loss weights) that vLLM ignores;
- `model.safetensors` (bf16): exactly the weights vLLM's EagleLlamaForCausalLM accepts, without a `model.`
  prefix: `fc.weight` [H, 2H], `layers.0.self_attn.{q,k,v,o}_proj.weight`, `layers.0.mlp.{gate,up,down}_proj.weight`,
  `layers.0.post_attention_layernorm.weight`. No input_layernorm, final norm or fc bias (vLLM has none and
  would refuse them), no lm_head (vLLM's model has no such module and refuses the name), no embed_tokens
  (vLLM shares the target's; recent versions would otherwise mark the drafter as having its own);
- `model.safetensors.index.json`: the weight map naming model.safetensors only, which makes vLLM's loader
  read that file and nothing else in the directory;
- `target_embeddings.safetensors` (bf16): the frozen copies of the target's `embed_tokens.weight` and
  `lm_head.weight` the drafter trained with, so that it loads without its target. vLLM uses the target's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import EAGLE
from draftsync.speculative.methods.checkpoint_files import (
    CONFIG_FILE,
    RESAVE,
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

    from draftsync.speculative.methods.eagle1.model import EagleDrafter

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TARGET_EMBEDDINGS_FILE = "target_embeddings.safetensors"
ARCHITECTURE = "LlamaForCausalLM"
DRAFTER_KIND = EAGLE.name  # config.json's `draftsync_drafter`


def eagle_config(drafter: EagleDrafter, saved_for: SavedFor) -> dict[str, Any]:
    """The whole config.json of an EAGLE-1 drafter directory."""
    import transformers

    from draftsync.speculative.methods.eagle3.checkpoint import transformer_layer_config

    config = drafter.config
    return {
        "architectures": [ARCHITECTURE],
        **transformer_layer_config(drafter),
        "transformers_version": transformers.__version__,
        "draftsync_drafter": DRAFTER_KIND,
        "draftsync_verifier": saved_for.verifier(),
        "draftsync_speculative_tokens": saved_for.speculative_tokens,
        "draftsync_loss_weights": {"feature": config.feature_loss_weight, "token": config.token_loss_weight},
    }


def save_eagle(drafter: EagleDrafter, out_dir: str | Path, saved_for: SavedFor) -> Path:
    """Write the drafter to `out_dir` (created; files replaced atomically) and return the directory."""
    state = bf16_tensors(drafter.state_dict())
    copies = {name: state.pop(name) for name in drafter.target_copy_names}
    index = {
        "metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
        "weight_map": {name: WEIGHTS_FILE for name in sorted(state)},
    }
    config = eagle_config(drafter, saved_for)
    return write_directory(
        out_dir, {WEIGHTS_FILE: state, TARGET_EMBEDDINGS_FILE: copies}, {INDEX_FILE: index, CONFIG_FILE: config}
    )


def is_eagle_config(config: dict[str, Any]) -> bool:
    return config.get("draftsync_drafter") == DRAFTER_KIND


def _drafter_config(config: dict[str, Any], path: Path):
    from draftsync.speculative.families import rope_scaling_of
    from draftsync.speculative.methods.eagle1.model import EagleConfig

    if config.get("model_type") != "llama" or config_value(config, path, "num_hidden_layers") != 1:
        raise DraftsyncError(f"{path} is not a one-layer Llama config, which an EAGLE-1 drafter is", RESAVE)
    rope = config.get("rope_parameters") or {}
    weights = config.get("draftsync_loss_weights") or {}
    hidden = config_value(config, path, "hidden_size")
    heads = config_value(config, path, "num_attention_heads")
    vocab = config_value(config, path, "vocab_size")
    return EagleConfig(
        hidden_size=hidden,
        target_hidden_size=hidden,
        vocab_size=vocab,
        draft_vocab_size=vocab,
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        intermediate_size=config_value(config, path, "intermediate_size"),
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        rope_scaling=rope_scaling_of(rope or config.get("rope_scaling")),
        sliding_window=config.get("sliding_window"),
        feature_loss_weight=weights.get("feature", 1.0),
        token_loss_weight=weights.get("token", 0.1),
    )


def load_eagle(directory: str | Path, dtype: torch.dtype | None = None) -> EagleDrafter:
    """Read a drafter written by save_eagle into an EagleDrafter (float32 unless `dtype` says otherwise)."""
    import torch

    from draftsync.speculative.methods.eagle1.model import EagleDrafter

    path, config = read_json(directory)
    if not is_eagle_config(config):
        raise DraftsyncError(
            f"{path} is not an EAGLE-1 drafter config (draftsync_drafter is "
            f"{config.get('draftsync_drafter')!r}, not {DRAFTER_KIND!r})",
            "load it with registry.load_drafter, which detects the format, or re-save it",
        )
    drafter = EagleDrafter(_drafter_config(config, path))
    folder = Path(directory)
    expected = drafter.state_dict()
    copies = set(drafter.target_copy_names)
    own = read_safetensors(folder / WEIGHTS_FILE)
    check_tensors(own, {k: v for k, v in expected.items() if k not in copies}, str(folder / WEIGHTS_FILE))
    shared = read_safetensors(folder / TARGET_EMBEDDINGS_FILE)
    check_tensors(shared, {k: v for k, v in expected.items() if k in copies}, str(folder / TARGET_EMBEDDINGS_FILE))
    drafter.load_state_dict({**own, **shared}, strict=True)
    return drafter.to(dtype or torch.float32).eval()
