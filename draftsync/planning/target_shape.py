"""What a plan needs of a target: its widths and its size, read from its config (a config-only directory will do) or
from the tags of its registry version, and what its passes and its served context cost."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from draftsync.errors import DraftsyncError


@dataclass(frozen=True)
class TargetShape:
    """What the plan needs of a target: its widths and its size, from its config (a config-only directory will do)."""

    name: str
    parameters: int
    hidden: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    checkpoint_dtype: str
    context: int  # the longest sequence its config allows (max_position_embeddings); 0: not known
    config: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_directory(cls, path: Path, name: str | None = None) -> TargetShape:
        from draftsync.speculative.targets import read_target_config

        config = read_target_config(Path(path))
        config = config.get("text_config", config) if "hidden_size" not in config else config
        needed = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads")
        missing = [k for k in needed if k not in config]
        if missing:
            raise DraftsyncError(
                f"{Path(path) / 'config.json'} lacks {', '.join(missing)}: not a decoder-only language model's config",
                "give a Llama-style causal LM (Llama, Mistral, Qwen2/3 and the like)",
            )
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        shape = cls(
            name=name or str(path),
            parameters=0,
            hidden=hidden,
            layers=int(config["num_hidden_layers"]),
            vocab=int(config["vocab_size"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=int(config.get("intermediate_size") or 4 * hidden),
            checkpoint_dtype=str(config.get("dtype") or config.get("torch_dtype") or "float32").replace("torch.", ""),
            context=int(config.get("max_position_embeddings") or 0),
            config=config,
        )
        counted = _safetensors_parameters(Path(path))
        return replace(shape, parameters=counted or shape.parameters_from_config())

    @classmethod
    def from_registered(
        cls, name: str, *, parameters: int, hidden: int, layers: int, vocab: int, features: dict[str, Any]
    ) -> TargetShape:
        """A target as its registry tags describe it (`families.config_features`), for planning before its files are
        fetched. Versions tagged before the features named the attention heads and the MLP width get hidden // head_dim
        heads and the width the parameter count leaves (both exact for Llama-style configs)."""
        head_dim = int(features["head_dim"])
        heads = int(features.get("attention_heads") or hidden // head_dim)
        tied = bool(features.get("tied_embeddings"))
        shape = cls(
            name=name,
            parameters=parameters,
            hidden=hidden,
            layers=layers,
            vocab=vocab,
            heads=heads,
            kv_heads=int(features.get("kv_heads") or heads),
            head_dim=head_dim,
            intermediate=int(features.get("intermediate_size") or 0),
            checkpoint_dtype=str(features.get("dtype") or "bfloat16").replace("torch.", ""),
            context=int(features.get("max_position_embeddings") or 0),
            config={"tie_word_embeddings": tied},
        )
        if shape.intermediate:
            return shape
        without_mlps = shape.parameters_from_config()  # the count's formula with no MLP width
        return replace(shape, intermediate=max(1, round((parameters - without_mlps) / (3 * hidden * layers))))

    def parameters_from_config(self) -> int:
        """A Llama-style count: embeddings, the lm_head unless tied, attention, SwiGLU MLP and norms per layer."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * self.intermediate + 2 * h
        head = 0 if self.config.get("tie_word_embeddings") else self.vocab * h
        return self.vocab * h + head + self.layers * per_layer + h

    def weight_bytes(self, on_gpu: bool) -> int:
        """fp32 on a CPU; on a GPU the checkpoint's 16-bit dtype (bf16 for an fp32 checkpoint)."""
        return self.parameters * (2 if on_gpu else 4)

    def kv_bytes_per_token(self) -> int:
        """A served token's keys and values over every layer, in 16 bits (vLLM's default KV dtype)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


def _safetensors_parameters(path: Path) -> int:
    """Parameters counted from the safetensors headers; 0 without weight files (a config-only directory) or with a
    header that cannot be read, which the target's loading then names."""
    import struct

    total = 0
    try:
        for file in sorted(path.glob("*.safetensors")):
            with file.open("rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(min(length, 100 << 20)))
            total += sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
        return 0
    return total


def forward_bytes(target: TargetShape, tokens: int) -> int:
    """One teacher-forced pass of `tokens` tokens: per token a layer's activations (16-bit), the kept states."""
    per_token = 2 * (6 * target.hidden + 2 * target.intermediate) + 4 * 4 * target.hidden
    return tokens * per_token
