"""What a plan needs of a target: its widths and its size, read from its config (a config-only directory will do) or
from the tags of its registry version, and what its passes and its served context cost."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from draftsync.planning.stages import Refusal
from draftsync.speculative.mtp_heads import MtpHead
from draftsync.speculative.target_description import TargetDescription


@dataclass(frozen=True)
class TargetShape:
    """What the plan needs of a target: its widths and its size, from its description (a config-only directory will
    do) or from the tags of its registry version."""

    name: str
    parameters: int  # every weight's, for memory
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
    active_parameters: int = 0  # a token's share (routed experts at the share it runs), for compute; 0: parameters
    stored_weight_bytes: int = 0  # its weights as stored (quantized or 16-bit); 0: parameters in 16 bits
    kv_per_token: int = 0  # a served token's keys and values over every layer; 0: from the attention widths
    description: TargetDescription | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_directory(cls, path: Path, name: str | None = None) -> TargetShape:
        from draftsync.speculative.target_description import describe

        return cls.described(describe(Path(path), name))

    @classmethod
    def described(cls, description: TargetDescription) -> TargetShape:
        return cls(
            name=description.name,
            parameters=description.parameters,
            hidden=description.hidden,
            layers=description.layers,
            vocab=description.vocab,
            heads=description.heads,
            kv_heads=description.kv_heads,
            head_dim=description.head_dim,
            intermediate=description.intermediate,
            checkpoint_dtype=description.dtype,
            context=description.context,
            config=description.config,
            active_parameters=description.active_parameters,
            stored_weight_bytes=description.weight_bytes,
            kv_per_token=description.kv_bytes_per_token,
            description=description,
        )

    @classmethod
    def from_registered(
        cls, name: str, *, parameters: int, hidden: int, layers: int, vocab: int, features: dict[str, Any]
    ) -> TargetShape:
        """A target as its registry tags describe it (`families.config_features` and the description's
        `size_features`), for planning before its files are fetched. Versions tagged before the features named the
        attention heads and the MLP width get hidden // head_dim heads and the width the parameter count leaves (both
        exact for Llama-style configs)."""
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
            active_parameters=int(features.get("active_parameters") or 0),
            stored_weight_bytes=int(features.get("weight_bytes") or 0),
            kv_per_token=int(features.get("kv_bytes_per_token") or 0),
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

    @property
    def compute_parameters(self) -> int:
        """The parameters a token's forward pass multiplies by (a mixture of experts runs a share of its own)."""
        return self.active_parameters or self.parameters

    def weight_bytes(self, on_gpu: bool) -> int:
        """fp32 on a CPU; on a GPU as stored (quantized weights at their bytes, an fp32 checkpoint in bf16)."""
        if not on_gpu:
            return self.parameters * 4
        sixteen_bit = self.parameters * 2
        return min(self.stored_weight_bytes, sixteen_bit) if self.stored_weight_bytes else sixteen_bit

    @property
    def mtp_head(self) -> MtpHead | None:
        """The MTP head it ships (known from its description only: registry tags do not say)."""
        return self.description.mtp_head if self.description is not None else None

    def mtp_head_parameters(self) -> int:
        """The parameters of the head layers vLLM serves (and a refresh trains)."""
        head = self.mtp_head
        if head is None or self.description is None:
            return 0
        served = head.summary()["served_layers"]
        return self.description.mtp_parameters * served // head.layers

    def mtp_head_bytes(self) -> int:
        """Those layers' weights as stored (quantized or 16-bit)."""
        head = self.mtp_head
        if head is None or self.description is None:
            return 0
        return self.description.mtp_weight_bytes * head.summary()["served_layers"] // head.layers

    def refusal(self) -> Refusal | None:
        """The sync's own refusal of the target (its family), which the plan reports beside the sizes."""
        unsupported = self.description.unsupported if self.description is not None else None
        if unsupported is None:
            return None
        return Refusal("target", "", "", unsupported.fix, reason=unsupported.what)

    def kv_bytes_per_token(self) -> int:
        """A served token's keys and values over every layer, in 16 bits (vLLM's default KV dtype): latent for MLA."""
        return self.kv_per_token or 2 * self.layers * self.kv_heads * self.head_dim * 2


def forward_bytes(target: TargetShape, tokens: int) -> int:
    """One teacher-forced pass of `tokens` tokens: per token a layer's activations (16-bit), the kept states."""
    per_token = 2 * (6 * target.hidden + 2 * target.intermediate) + 4 * 4 * target.hidden
    return tokens * per_token
