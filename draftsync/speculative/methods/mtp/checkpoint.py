"""MTP heads on disk: the directory vLLM's `mtp` method loads as its `model`, and the head a target ships.

A saved directory holds:
- `config.json`: the target's own fields as a MiMo checkpoint writes them (`architectures` ["MiMoForCausalLM"],
  `num_nextn_predict_layers` 1, the target's layer count, widths, norms and rope), which vLLM turns into its
  MiMoMTPModel, plus our `draftsync_*` fields (drafter kind, verifier, speculative tokens) that vLLM ignores.
  `model_type` is "qwen2": MiMo's own "mimo" names configuration code its checkpoint carries (auto_map), which a head
  directory does not, and vLLM reads the head's layer as a Qwen2 one either way;
- `model.safetensors` (bf16): exactly the tensors vLLM's MiMoMTP loads, under the checkpoint's names:
  `model.mtp_layers.0.{token_layernorm, hidden_layernorm, input_proj, input_layernorm, self_attn.{q,k,v,o}_proj,
  post_attention_layernorm, mlp.{gate,up,down}_proj, final_layernorm}`, `model.embed_tokens.weight` and
  `lm_head.weight` (vLLM replaces the last two by the target's own when serving).

A MiMo target's own checkpoint holds the same names beside its decoder's (`read_shipped_mtp` reads them); vLLM
serves that head from the target's directory itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import MTP
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
from draftsync.speculative.mtp_heads import MIMO

if TYPE_CHECKING:
    import torch

    from draftsync.speculative.methods.mtp.model import MtpConfig, MtpHead

WEIGHTS_FILE = "model.safetensors"
ARCHITECTURE = MIMO.architectures[0]  # the architecture vLLM turns into its MTP model, and whose state it feeds it
MODEL_TYPE = "qwen2"
MTP_LAYERS_FIELD = MIMO.count_field
# vLLM's default rope base of a Qwen2 layer whose config names none.
QWEN2_ROPE_THETA = 1_000_000.0


def mtp_config(drafter: MtpHead, saved_for: SavedFor) -> dict[str, Any]:
    """The whole config.json of an MTP head directory."""
    import transformers

    config = drafter.config
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        MTP_LAYERS_FIELD: 1,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_target_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": config.rope_parameters(),
        "use_sliding_window": bool(config.sliding_window),
        "sliding_window": config.sliding_window,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": transformers.__version__,
        "draftsync_drafter": MTP.name,
        "draftsync_verifier": saved_for.verifier(),
        "draftsync_speculative_tokens": saved_for.speculative_tokens,
    }


def save_mtp(drafter: MtpHead, out_dir: str | Path, saved_for: SavedFor) -> Path:
    """Write the head to `out_dir` (created; files replaced atomically) and return the directory.

    Only for a MiMoForCausalLM target: vLLM hands an MTP layer the pre-norm last state, which the head learnt from,
    only there; another family's model returns its normalised state, which the head was never trained on.
    """
    if ARCHITECTURE not in saved_for.verifier_architectures:
        raise DraftsyncError(
            f"an MTP head was saved for a {', '.join(saved_for.verifier_architectures) or 'unnamed'} target; vLLM "
            f"feeds an MTP layer the pre-norm last state it reads only from a {ARCHITECTURE} target",
            f"use method {MTP.name!r} with a target whose config declares MTP layers ({ARCHITECTURE}, "
            f"{MTP_LAYERS_FIELD} >= 1), and another method for this one",
        )
    state = bf16_tensors(drafter.state_dict())
    return write_directory(out_dir, {WEIGHTS_FILE: state}, {CONFIG_FILE: mtp_config(drafter, saved_for)})


def is_mtp_config(config: dict[str, Any]) -> bool:
    return config.get("draftsync_drafter") == MTP.name


def declares_mtp_layers(config: dict[str, Any]) -> bool:
    """Whether a target's config.json says its checkpoint ships MTP layers vLLM's `mtp` method serves."""
    return ARCHITECTURE in (config.get("architectures") or []) and int(config.get(MTP_LAYERS_FIELD) or 0) > 0


def _head_config(config: dict[str, Any], path: Path) -> MtpConfig:
    """The head's shapes from a MiMo (Qwen2) config.json: a saved head's or a target's own."""
    from draftsync.speculative.families import rope_scaling_of, sliding_window_of
    from draftsync.speculative.methods.mtp.model import MtpConfig

    rope = config.get("rope_parameters") or {}
    hidden = config_value(config, path, "hidden_size")
    heads = config_value(config, path, "num_attention_heads")
    vocab = config_value(config, path, "vocab_size")
    return MtpConfig(
        hidden_size=hidden,
        target_hidden_size=hidden,
        vocab_size=vocab,
        draft_vocab_size=vocab,
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=hidden // heads,  # vLLM's Qwen2 layer sizes its heads so, whatever the config says
        intermediate_size=config_value(config, path, "intermediate_size"),
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", QWEN2_ROPE_THETA))),
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        rope_scaling=rope_scaling_of(rope or config.get("rope_scaling")),
        sliding_window=sliding_window_of(config),
        num_target_layers=config_value(config, path, "num_hidden_layers"),
    )


def load_mtp(directory: str | Path, dtype: torch.dtype | None = None) -> MtpHead:
    """Read a head written by save_mtp, or the one a MiMo target's own checkpoint ships, into an MtpHead (float32
    unless `dtype` says otherwise)."""
    import torch

    from draftsync.speculative.methods.mtp.model import MtpHead

    path, config = read_json(directory)
    if not is_mtp_config(config):
        if declares_mtp_layers(config):
            return read_shipped_mtp(directory, dtype)
        raise DraftsyncError(
            f"{path} is not an MTP head config (draftsync_drafter is {config.get('draftsync_drafter')!r}, not "
            f"{MTP.name!r}, and it declares no MTP layers)",
            "load it with registry.load_drafter, which detects the format, or re-save it",
        )
    drafter = MtpHead(_head_config(config, path))
    weights = read_safetensors(Path(directory) / WEIGHTS_FILE)
    check_tensors(weights, drafter.state_dict(), str(Path(directory) / WEIGHTS_FILE))
    drafter.load_state_dict(weights, strict=True)
    return drafter.to(dtype or torch.float32).eval()


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint: its index's, else every *.safetensors (vLLM reads them all, so a head
    may sit in a file of its own beside model.safetensors)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise DraftsyncError(
                f"{index} is not a readable weight index ({error})", "restore or re-export the checkpoint"
            ) from error
        return [folder / name for name in names]
    return sorted(folder.glob("*.safetensors"))


def read_shipped_mtp(target_dir: str | Path, dtype: torch.dtype | None = None) -> MtpHead:
    """The MTP head a target's own checkpoint carries (`model.mtp_layers.0.*` beside its decoder), as an MtpHead
    with the target's embedding and lm_head (float32 unless `dtype` says otherwise).

    Refused with the missing tensors named when the config declares MTP layers its weights lack: vLLM would start
    and serve an uninitialised layer.
    """
    import torch
    from safetensors import safe_open

    from draftsync.speculative.methods.mtp.model import MtpHead
    from draftsync.speculative.target_description import read_target_config, text_config

    folder = Path(target_dir)
    config = text_config(read_target_config(folder))
    declared = int(config.get(MTP_LAYERS_FIELD) or 0)
    if declared < 1:
        raise DraftsyncError(
            f"target {folder} declares no MTP layers ({MTP_LAYERS_FIELD} is {config.get(MTP_LAYERS_FIELD)!r})",
            f"use method {MTP.name!r} only with a target that ships MTP layers; train a drafter for this one "
            "(e.g. eagle3)",
        )
    architectures = config.get("architectures") or []
    if ARCHITECTURE not in architectures:
        raise DraftsyncError(
            f"target {folder} ({', '.join(architectures) or 'no architecture'}) ships MTP layers in another family's "
            f"layout than {ARCHITECTURE}'s",
            f"serve it with vLLM's method {MTP.name!r} as it ships; draftsync reads MiMo-style heads only",
        )
    drafter = MtpHead(_head_config(config, folder / CONFIG_FILE))
    expected = drafter.state_dict()
    found: dict[str, torch.Tensor] = {}
    for file in _weight_files(folder):
        if not file.is_file():
            raise DraftsyncError(f"{file} is missing (named by the checkpoint's weight index)", "re-download it")
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                if name in expected:
                    found[name] = handle.get_tensor(name)
    if "lm_head.weight" not in found and config.get("tie_word_embeddings") and "model.embed_tokens.weight" in found:
        found["lm_head.weight"] = found["model.embed_tokens.weight"]  # a tied head is the embedding
    missing = sorted(set(expected) - set(found))
    if missing:
        raise DraftsyncError(
            f"target {folder} declares {declared} MTP layer(s) ({MTP_LAYERS_FIELD}) but its weights lack "
            f"{len(missing)} of the MTP head's tensors: {', '.join(missing)}",
            "use the checkpoint as released, with its model.mtp_layers.* tensors (a conversion or quantisation "
            f"that dropped them must keep them), or set {MTP_LAYERS_FIELD} to 0 in its config.json and train a "
            "drafter for it (e.g. eagle3)",
        )
    wrong = sorted(name for name in expected if found[name].shape != expected[name].shape)
    if wrong:
        raise DraftsyncError(
            f"target {folder}'s MTP tensors {', '.join(wrong)} do not have the shapes its config gives",
            "restore or re-export the checkpoint: its config.json and its weights disagree",
        )
    drafter.load_state_dict(found, strict=True)
    return drafter.to(dtype or torch.float32).eval()
