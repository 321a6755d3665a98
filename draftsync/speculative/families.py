"""The target families (decoder architectures) draftsync trains drafters for, told apart by a config.json alone.

Not to be confused with a drafter method's family (speculative/methods: eagle, medusa, ...).

One home for what a family is: its transformers architecture and what distinguishes its checkpoints (read from
the config, never assumed from the family: grouped-query attention, head_dim, tied embeddings, rope, q/k norm, qkv
bias, sliding windows). Every trained drafter method serves next to each family (see FAMILIES). Everything else
(hidden states, drafter shapes, rope, tied weights) is read from the config by the code that needs it; nothing
branches on the family name.

What is refused, and why, is here too: multimodal and encoder-decoder checkpoints, mixture-of-experts checkpoints
outside the MoE families of FAMILIES, and architectures that have never been run through a sync.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from draftsync.errors import DraftsyncError


@dataclass(frozen=True)
class Family:
    """A decoder family: the `architectures` entry of its config.json, its `model_type`, whether its MLPs are routed
    experts (`moe`), and the `--model-impl` vLLM must serve it with (None: vLLM's own choice)."""

    name: str
    architecture: str
    model_type: str
    moe: bool = False
    vllm_model_impl: str | None = None


# vLLM 0.32 serves every trained method next to each of these (DFlash next to a gpt-oss target only where vLLM keeps
# the draft layers in one KV cache group: `serving/vllm_args.check_drafter_for_vllm`). It reads aux hidden states
# (EAGLE-3, DFlash) from a target class that implements SupportsEagle3: its own for every family but Mixtral, whose
# targets it serves through its Transformers backend (`vllm_model_impl`) on every launch, so plain and speculative
# servers run one implementation. EAGLE-1's drafter is a Llama layer fed the target's final state whatever the
# target, and Medusa reads only that state.
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("llama", "LlamaForCausalLM", "llama"),
        Family("qwen3", "Qwen3ForCausalLM", "qwen3"),
        Family("qwen2", "Qwen2ForCausalLM", "qwen2"),
        Family("mistral", "MistralForCausalLM", "mistral"),
        Family("qwen3_moe", "Qwen3MoeForCausalLM", "qwen3_moe", moe=True),
        Family("mixtral", "MixtralForCausalLM", "mixtral", moe=True, vllm_model_impl="transformers"),
        Family("gpt_oss", "GptOssForCausalLM", "gpt_oss", moe=True),
    )
}
_BY_ARCHITECTURE = {f.architecture: f for f in FAMILIES.values()}
_BY_MODEL_TYPE = {f.model_type: f for f in FAMILIES.values()}
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
_SUPPORTED = ", ".join(f"{f.name} ({f.architecture})" for f in FAMILIES.values())
_SUPPORTED_DENSE = ", ".join(f"{f.name} ({f.architecture})" for f in FAMILIES.values() if not f.moe)
_SUPPORTED_MOE = ", ".join(f"{f.name} ({f.architecture})" for f in FAMILIES.values() if f.moe)


def _architecture(config: Mapping[str, Any]) -> str:
    return str((config.get("architectures") or [config.get("model_type") or "unknown"])[0])


def target_family(config: Mapping[str, Any], what: str = "the target") -> Family:
    """The family of a checkpoint's config.json, or a DraftsyncError that says why it is refused and what is near."""
    architecture = _architecture(config)
    if config.get("is_encoder_decoder"):
        raise DraftsyncError(
            f"{what} is an encoder-decoder model ({architecture}): vLLM's speculative decoding drafts for "
            "decoder-only targets",
            f"register a decoder-only checkpoint: {_SUPPORTED}",
        )
    if "vision_config" in config or "audio_config" in config or "text_config" in config:
        raise DraftsyncError(
            f"{what} is a multimodal model ({architecture}): draftsync trains drafters for text decoders only",
            "register its language model as a text-only checkpoint of a supported family "
            f"({_SUPPORTED}), or serve it without a drafter",
        )
    family = _BY_ARCHITECTURE.get(architecture) or _BY_MODEL_TYPE.get(str(config.get("model_type")))
    if family is not None and family.moe:
        return family
    if any(config.get(key) for key in _MOE_KEYS) or "moe" in architecture.lower():
        raise DraftsyncError(
            f"{what} is a mixture-of-experts model ({architecture}) outside the MoE families draftsync has run a "
            f"sync through ({_SUPPORTED_MOE})",
            f"register a checkpoint of one of those, or a dense model ({_SUPPORTED_DENSE}), or serve it with an "
            "n-gram drafter (method ngram) that needs no training",
        )
    if family is None:
        raise DraftsyncError(
            f"{what} is a {architecture}, an architecture draftsync does not train drafters for",
            f"register a checkpoint of a supported family: {_SUPPORTED}",
        )
    return family


def rope_scaling_of(rope_parameters: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The non-default part of a config's `rope_parameters` (rope_scaling for transformers 4 configs), or None."""
    rest = {k: v for k, v in (rope_parameters or {}).items() if k not in ("rope_theta", "type")}
    kind = rest.get("rope_type") or (rope_parameters or {}).get("type") or "default"
    return None if kind == "default" else {**rest, "rope_type": kind}


def sliding_window_of(config: Mapping[str, Any]) -> int | None:
    """The attention window every layer of a config applies, or None: Qwen2/3 configs carry a window they switch off
    with use_sliding_window, and one that `layer_types` gives only some layers (gpt-oss) is no drafter's window,
    since vLLM windows a draft layer only with the window of a target whose every layer has it."""
    window = config.get("sliding_window")
    if not window or not config.get("use_sliding_window", True):
        return None
    if any(kind != "sliding_attention" for kind in config.get("layer_types") or ()):
        return None
    return int(window)


def config_features(config: Mapping[str, Any]) -> dict[str, Any]:
    """What distinguishes a checkpoint inside its family, as its config says it (for tags and for the docs)."""
    heads = int(config.get("num_attention_heads") or 0)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    hidden = int(config.get("hidden_size") or 0)
    rope = rope_scaling_of(config.get("rope_parameters") or config.get("rope_scaling")) or {}
    model_type = str(config.get("model_type"))
    return {
        "attention_heads": heads,
        "kv_heads": kv_heads,
        "grouped_query_attention": bool(heads and kv_heads < heads),
        "head_dim": int(config.get("head_dim") or (hidden // heads if heads else 0)),
        "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
        "rope_type": str(rope.get("rope_type", "default")),
        # Qwen3 (and Qwen3-MoE) always normalises q and k; Qwen2 always biases q, k and v (their configs do not say it).
        "qk_norm": model_type in ("qwen3", "qwen3_moe"),
        "qkv_bias": model_type == "qwen2" or bool(config.get("attention_bias")),
        "sliding_window": sliding_window_of(config),
        "dtype": str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
        "intermediate_size": int(config.get("intermediate_size") or 0),
        "max_position_embeddings": int(config.get("max_position_embeddings") or 0),
    }


def vllm_attention_kinds(config: Mapping[str, Any]) -> list[str]:
    """The attention kind of each layer as vLLM 0.32 serves a config: gpt-oss windows its even layers whatever its
    `layer_types` say, every other class follows `layer_types` (none: one kind)."""
    layers = int(config.get("num_hidden_layers") or 0)
    if config.get("model_type") == "gpt_oss":
        windowed = bool(config.get("sliding_window"))
        return ["sliding_attention" if windowed and i % 2 == 0 else "full_attention" for i in range(layers)]
    return list(config.get("layer_types") or ["full_attention"] * layers)


def draft_layers_split(config: Mapping[str, Any], draft_layers: int) -> str | None:
    """Why vLLM 0.32 would split a DFlash drafter's `draft_layers` layers across KV cache groups next to this target,
    which it then refuses ("All drafting layers should belong to the same kv cache group"); None when it would not.
    vLLM groups each attention kind's layers, the drafter's full-attention layers with the target's, into groups of one
    size: the larger kind's count when it is under 1.5 times the smaller's, else the smaller's; a kind with more layers
    than that is dealt round-robin into several groups, and the drafter's layers with it."""
    kinds = vllm_attention_kinds(config)
    windowed = kinds.count("sliding_attention")
    full = len(kinds) - windowed + draft_layers
    if not windowed or draft_layers < 2:
        return None
    group = max(full, windowed) if max(full, windowed) < 1.5 * min(full, windowed) else min(full, windowed)
    if full <= group:
        return None
    return (
        f"vLLM 0.32 splits a {draft_layers}-layer DFlash drafter across KV cache groups beside {windowed} "
        f"sliding-window and {full - draft_layers} full-attention layers, and refuses to start"
    )
