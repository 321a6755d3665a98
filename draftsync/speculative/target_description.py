"""One description of a target, read once from its config.json and, when it has weights, its safetensors headers:
its family, widths, experts, attention, multi-token-prediction layers, quantization and dtype, its parameters (total,
active per token, MTP) and the bytes of its weights. Registration tags, the plan and the sync read it.

`describe` is also the one check of a target's config that the plan and the sync both apply: what cannot be sized
(zero layers, experts without a per-token count, a quantization method it does not know) is refused here; a family
draftsync cannot sync is recorded in `unsupported`, so a plan can still size it and say why it is refused.

Parameters are counted from the model transformers builds from the config on the meta device (no memory, exact for
MLA, sinks, biases and fused experts alike); the routed experts are told apart by their names.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsync.errors import DraftsyncError
from draftsync.speculative.mtp_heads import MtpHead, mtp_head_of, require_head_weights

# Fields that declare routed experts, and those that give how many run for each token, family by family.
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
_PER_TOKEN_KEYS = ("num_experts_per_tok", "moe_topk", "top_k")
# Fields that declare multi-token-prediction layers beside the decoder (DeepSeek-V3, GLM-4.5, MiMo; Qwen3-Next).
_MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Bytes of one safetensors element, by the header's dtype name.
_STORED_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip


def read_target_config(path: Path) -> dict:
    """A checkpoint's config.json, or an error that names what is missing or broken."""
    from draftsync.user_files import check_path

    config_file = path / "config.json"
    check_path(
        path,
        "directory",
        "target checkpoint",
        "point at a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files)",
    )
    if not config_file.exists():
        raise DraftsyncError(
            f"target checkpoint {path} has no config.json",
            "point at a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files)",
        )
    try:
        return json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise DraftsyncError(
            f"target config {config_file} is not valid JSON ({exc})", "restore or re-export the checkpoint"
        ) from exc


@dataclass(frozen=True)
class Quantization:
    """How a checkpoint stores its quantized weights: the method, the bits of a weight, the bytes one takes with its
    scales, whether only the routed experts are quantized (gpt-oss's mxfp4), and the header dtypes its quantized
    tensors are stored in (what registration checks the files against)."""

    method: str
    bits: int
    bytes_per_weight: float
    experts_only: bool
    stored_as: tuple[str, ...]

    def label(self) -> str:
        return f"{self.method} ({self.bits}-bit{', experts only' if self.experts_only else ''})"


KNOWN_QUANTIZATION = ("fp8", "compressed-tensors", "awq", "gptq", "mxfp4")


def quantization_of(config: Mapping[str, Any], what: str) -> Quantization | None:
    """The checkpoint's `quantization_config` as the plan counts it; None when it has none; refused when its method is
    not one the plan knows how many bytes a weight takes."""
    declared = config.get("quantization_config")
    if not declared:
        return None
    method = str(declared.get("quant_method") or "").lower()
    group = int(declared.get("group_size") or 128)
    if method == "fp8":  # transformers' fine-grained FP8 (DeepSeek-V3, Qwen3-FP8): an fp32 scale per block
        block = declared.get("weight_block_size") or [128, 128]
        return Quantization("fp8", 8, 1 + 4 / math.prod(block), False, ("F8_E4M3", "F8_E5M2"))
    if method == "compressed-tensors":  # llm-compressor's: the weights' bits from its config groups
        groups = [g.get("weights") or {} for g in (declared.get("config_groups") or {}).values()]
        bits = min((int(g.get("num_bits") or 8) for g in groups), default=8)
        floating = any(g.get("type") == "float" for g in groups)
        stored = ("F8_E4M3", "F8_E5M2") if floating and bits == 8 else ("I8", "I32", "U8")
        scales = 2 / int(groups[0].get("group_size") or 0) if groups and groups[0].get("group_size") else 0.0
        return Quantization("compressed-tensors", bits, bits / 8 + scales, False, stored)
    if method in ("awq", "gptq"):  # packed int4 (or int8) with an fp16 scale and a packed zero per group
        bits = int(declared.get("bits") or declared.get("w_bit") or 4)
        group = int(declared.get("group_size") or declared.get("q_group_size") or group)
        return Quantization(method, bits, bits / 8 + (2 + bits / 8) / group, False, ("I32",))
    if method == "mxfp4":  # OCP microscaling: 4-bit values and an 8-bit scale per 32, routed experts only
        return Quantization("mxfp4", 4, 0.5 + 1 / 32, True, ("U8",))
    raise DraftsyncError(
        f"{what} declares quantization_config.quant_method {method or '(none)'!r}, which draftsync cannot size",
        f"use a checkpoint quantized with one of {', '.join(KNOWN_QUANTIZATION)}, or its unquantized release",
    )


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts target's routing: routed experts per MoE layer, how many a token runs, shared experts."""

    routed: int
    per_token: int
    shared: int


def experts_of(config: Mapping[str, Any], what: str) -> Experts | None:
    """The config's experts, refused when they cannot be what a model runs."""
    routed = next((int(config[k]) for k in _EXPERT_KEYS if config.get(k)), 0)
    if not routed:
        return None
    per_token = next((config[k] for k in _PER_TOKEN_KEYS if config.get(k) is not None), None)
    if per_token is None:
        raise DraftsyncError(
            f"{what} declares {routed} experts but not how many run for each token",
            "set num_experts_per_tok in its config.json (the value the model was trained with)",
        )
    if not 1 <= int(per_token) <= routed:
        raise DraftsyncError(
            f"{what} routes each token to {per_token} of its {routed} experts",
            "set num_experts_per_tok between 1 and the number of experts",
        )
    return Experts(routed, int(per_token), int(config.get("n_shared_experts") or config.get("shared_experts") or 0))


@dataclass(frozen=True)
class Counts:
    """A target's parameters, by how a forward pass and the weight files treat them."""

    total: int  # what transformers loads (the MTP layers are not among them)
    routed: int  # of which in routed experts
    quantizable: int  # of which in decoder layers' linear weights (what fp8/int4 methods quantize)
    last_layer: int  # the last decoder layer's, the size of an MTP layer
    last_layer_quantizable: int


def count_parameters(config: Mapping[str, Any], what: str) -> Counts:
    """Counted from the model transformers builds from `config` on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    settings = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map")}
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        built = AutoConfig.for_model(**settings)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(built)
    except Exception as exc:
        raise DraftsyncError(
            f"{what}: transformers cannot build a {config.get('model_type')} model from its config.json "
            f"({type(exc).__name__}: {exc})",
            "give the config.json the checkpoint was saved with (a transformers causal LM's)",
        ) from exc
    finally:
        transformers_logging.set_verbosity(verbosity)
    total = routed = quantizable = last = last_quantizable = 0
    final = f"layers.{int(config['num_hidden_layers']) - 1}."
    for name, tensor in model.named_parameters():
        n = tensor.numel()
        total += n
        routed += n if ".experts." in name else 0
        linear = ".layers." in name and tensor.dim() >= 2 and not _is_router(name)
        quantizable += n if linear else 0
        if final in name:
            last += n
            last_quantizable += n if linear else 0
    return Counts(total, routed, quantizable, last, last_quantizable)


def _is_router(name: str) -> bool:
    return name.endswith("mlp.gate.weight") or ".router." in name


@dataclass(frozen=True)
class TargetDescription:
    """A target as the plan, its tags and the sync read it. `unsupported`: why a sync would refuse its family (None
    when draftsync syncs it)."""

    name: str
    config: dict[str, Any] = field(repr=False)
    architecture: str
    family: str | None
    unsupported: DraftsyncError | None = field(repr=False)
    hidden: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    context: int  # the longest sequence its config allows; 0: not known
    dtype: str  # the checkpoint's dtype for its unquantized tensors
    experts: Experts | None
    quantization: Quantization | None
    attention: str  # "mla" (latent keys and values, DeepSeek) or "gqa" (grouped or full multi-head)
    kv_bytes_per_token: int  # a served token's keys and values over every layer, in 16 bits
    mtp_layers: int
    mtp_head: MtpHead | None  # the head vLLM serves with method mtp (None: none, or a family it has no MTP model for)
    parameters: int
    active_parameters: int  # per token: routed experts at the share a token runs
    mtp_parameters: int
    mtp_weight_bytes: int  # the MTP layers as stored (quantized like the decoder's linear layers, else 16-bit)
    weight_bytes: int  # the weights a server or transformers holds (without the MTP layers), as stored
    checkpoint_bytes: int  # every weight file's tensors (MTP layers included): from the headers, else estimated
    checkpoint_bytes_from: str  # "files" or "config"

    def require_supported(self) -> None:
        if self.unsupported is not None:  # a fresh error: a described target is shared by every caller
            raise DraftsyncError(self.unsupported.what, self.unsupported.fix)

    def summary(self) -> dict[str, Any]:
        """What the plan and `status` show of it."""
        return {
            "architecture": self.architecture,
            "family": self.family,
            "parameters": self.parameters,
            "active_parameters": self.active_parameters,
            "mtp_layers": self.mtp_layers,
            "mtp_parameters": self.mtp_parameters,
            "mtp_head": None if self.mtp_head is None else self.mtp_head.summary(),
            "experts": None if self.experts is None else vars(self.experts),
            "attention": self.attention,
            "dtype": self.dtype,
            "quantization": None if self.quantization is None else self.quantization.label(),
            "weight_gib": round(self.weight_bytes / 1024**3, 2),
            "checkpoint_gib": round(self.checkpoint_bytes / 1024**3, 2),
            "checkpoint_gib_from": self.checkpoint_bytes_from,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "text": self.text(),
        }

    def text(self) -> str:
        """What it is, in the words of a plan: what sizes its memory and its compute."""
        parts = [f"{self.architecture}, {self.parameters / 1e9:.2f}B parameters"]
        if self.experts:
            shared = f" and {self.experts.shared} shared" if self.experts.shared else ""
            parts.append(
                f"mixture of experts: {self.experts.per_token} of {self.experts.routed} routed experts a token"
                f"{shared}, {self.active_parameters / 1e9:.2f}B active (compute times use these)"
            )
        if self.attention == "mla":
            parts.append(f"MLA attention: {self.kv_bytes_per_token:,} bytes of latent KV cache a token")
        if self.mtp_head is not None:
            head = self.mtp_head.layout
            refresh = "a head draftsync can refresh" if head.refreshed_here else "a head draftsync does not refresh"
            parts.append(
                f"its own MTP head ({head.family}): {self.mtp_layers} layer(s), {self.mtp_parameters / 1e9:.2f}B "
                f"parameters, reading the target's {'pre-norm' if head.reads == 'pre_norm' else 'final'} state; "
                f"vLLM serves it with method mtp; {refresh}"
            )
        elif self.mtp_layers:
            parts.append(
                f"{self.mtp_layers} MTP layer(s) ({self.mtp_parameters / 1e9:.2f}B parameters): in the checkpoint, "
                "not loaded by the sync's target nor served beside its drafter"
            )
        stored = "its files" if self.checkpoint_bytes_from == "files" else "estimated from its config"
        parts.append(
            f"weights {self.quantization.label() if self.quantization else self.dtype}: "
            f"{self.weight_bytes / 1024**3:.1f} GiB loaded, {self.checkpoint_bytes / 1024**3:.1f} GiB of checkpoint "
            f"({stored})"
        )
        return "; ".join(parts)

    def size_features(self) -> dict[str, Any]:
        """The tags' share of it: what planning from a registry version needs beyond the config's features."""
        return {
            "active_parameters": self.active_parameters,
            "weight_bytes": self.weight_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "experts": 0 if self.experts is None else self.experts.routed,
            "experts_per_token": 0 if self.experts is None else self.experts.per_token,
            "quantization": None if self.quantization is None else self.quantization.method,
            "mtp_layers": self.mtp_layers,
            "mtp_head": None if self.mtp_head is None else self.mtp_head.layout.family,
        }


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (a multimodal one nests it under text_config)."""
    return dict(config.get("text_config", config) if "hidden_size" not in config else config)


def describe(path: Path, name: str | None = None, what: str | None = None) -> TargetDescription:
    """The description of the checkpoint (or config-only directory) at `path`: read once a process while its
    config.json and weight files stay as they are (the sync's fetch, plan, loads and training ask for it again)."""
    path = Path(path)
    return _described(path, _stamp(path), name or str(path), what or f"target checkpoint {path}")


@functools.lru_cache(maxsize=16)
def _described(path: Path, stamp: tuple, name: str, what: str) -> TargetDescription:
    del stamp  # a key of the cache only: a changed file reads the target anew
    return describe_config(read_target_config(path), name, what, path)


def _stamp(path: Path) -> tuple:
    """What the description is read from, as it stands: each file's name, size and modification time."""
    files = [path / "config.json", *sorted(path.glob("*.safetensors"))] if path.is_dir() else []
    return tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file())


def describe_config(raw: Mapping[str, Any], name: str, what: str, weights_dir: Path | None = None) -> TargetDescription:
    """The description of a target from its config (and the weight files under `weights_dir`, when there are)."""
    from draftsync.speculative.families import target_family

    config = text_config(raw)
    unsupported = None
    family = None
    try:
        family = target_family(dict(raw), what).name
    except DraftsyncError as refusal:
        unsupported = refusal
    needed = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads")
    missing = [k for k in needed if k not in config]
    if missing and unsupported is not None:  # another architecture's config (GPT-2's n_embd): say that
        raise DraftsyncError(unsupported.what, unsupported.fix)
    if missing:
        raise DraftsyncError(
            f"{what}: its config.json lacks {', '.join(missing)}: not a decoder-only language model's config",
            "give a transformers causal LM's config.json (Llama, Mistral, Qwen and the like)",
        )
    layers = int(config["num_hidden_layers"])
    if layers < 1:
        raise DraftsyncError(
            f"{what}: its config.json declares num_hidden_layers {layers}", "give the config the model was saved with"
        )
    experts = experts_of(config, what)
    quantization = quantization_of(config, what)
    try:
        counts = count_parameters(config, what)
    except DraftsyncError:
        if unsupported is not None:  # transformers cannot build it either: the family is what to say
            raise DraftsyncError(unsupported.what, unsupported.fix) from None
        raise
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    mtp_head = mtp_head_of(raw, what)
    mtp_layers = mtp_head.layers if mtp_head else next((int(config[k]) for k in _MTP_KEYS if config.get(k)), 0)
    mtp = mtp_layers * (counts.last_layer + 2 * hidden * hidden + 3 * hidden)
    mtp_quantizable = mtp_layers * counts.last_layer_quantizable
    active = counts.total - (counts.routed - counts.routed * experts.per_token // experts.routed if experts else 0)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").replace("torch.", "")
    weights = _weight_bytes(counts.total, counts, quantization, _DTYPE_BYTES.get(dtype, 2))
    mtp_weights = _weight_bytes(mtp, Counts(mtp, 0, mtp_quantizable, 0, 0), quantization, 2)
    estimated = weights + mtp_weights
    entries = _headers(weights_dir)
    stored = {entry["name"]: entry["dtype"] for entry in entries}
    if stored and mtp_head is not None:
        require_head_weights(mtp_head, layers, stored, what)
    if stored and quantization is not None:
        _check_stored(stored, quantization, what)
    elif any(kind.startswith("F8") for kind in stored.values()):
        raise DraftsyncError(
            f"{what} stores float8 weights but its config.json declares no quantization_config",
            "keep the config.json saved with the quantized weights (it names their quant_method)",
        )
    file_bytes = sum(_tensor_bytes(entry) for entry in entries)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    latent = config.get("kv_lora_rank")
    kv = (
        layers * (int(latent) + int(config.get("qk_rope_head_dim") or 0)) * 2
        if latent
        else 2 * layers * kv_heads * head_dim * 2
    )
    return TargetDescription(
        name=name,
        config=config,
        architecture=str((raw.get("architectures") or [raw.get("model_type") or "unknown"])[0]),
        family=family,
        unsupported=unsupported,
        hidden=hidden,
        layers=layers,
        vocab=int(config["vocab_size"]),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=int(config.get("intermediate_size") or 4 * hidden),
        context=int(config.get("max_position_embeddings") or 0),
        dtype=dtype,
        experts=experts,
        quantization=quantization,
        attention="mla" if latent else "gqa",
        kv_bytes_per_token=kv,
        mtp_layers=mtp_layers,
        mtp_head=mtp_head,
        parameters=counts.total,
        active_parameters=active,
        mtp_parameters=mtp,
        mtp_weight_bytes=mtp_weights,
        weight_bytes=weights,
        checkpoint_bytes=file_bytes or estimated,
        checkpoint_bytes_from="files" if file_bytes else "config",
    )


def _weight_bytes(parameters: int, counts: Counts, quantization: Quantization | None, width: int) -> int:
    """Bytes of `parameters` stored at `width` bytes, the quantized share at the quantization's bytes a weight."""
    if quantization is None:
        return parameters * width
    quantized = counts.routed if quantization.experts_only else counts.quantizable
    return round(quantized * quantization.bytes_per_weight + (parameters - quantized) * width)


def _headers(weights_dir: Path | None) -> list[dict[str, Any]]:
    """Every tensor entry of the safetensors headers under `weights_dir`; [] without weight files."""
    entries: list[dict[str, Any]] = []
    for file in sorted(Path(weights_dir).glob("*.safetensors")) if weights_dir is not None else []:
        try:
            with file.open("rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(min(length, 100 << 20)))
        except (OSError, ValueError, struct.error) as exc:
            raise DraftsyncError(
                f"target weights {file} are corrupt ({exc})", "re-export or re-download the checkpoint"
            ) from exc
        entries += [{"name": k, **v} for k, v in header.items() if k != "__metadata__"]
    return entries


def _tensor_bytes(entry: Mapping[str, Any]) -> int:
    return math.prod(entry["shape"]) * _STORED_BYTES.get(entry["dtype"], 2)


def _check_stored(stored: Mapping[str, str], quantization: Quantization, what: str) -> None:
    """Refuse weights that do not hold what the config's quantization declares."""
    if any(dtype in quantization.stored_as for dtype in stored.values()):
        return
    kinds = ", ".join(sorted(set(stored.values())))
    raise DraftsyncError(
        f"{what} declares {quantization.label()} weights, but its safetensors hold only {kinds} tensors "
        f"(a {quantization.method} checkpoint stores {' or '.join(quantization.stored_as)})",
        "register the weights its quantization_config was written for, or remove quantization_config from an "
        "unquantized checkpoint's config.json",
    )
