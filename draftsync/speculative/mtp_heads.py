"""Multi-token-prediction (MTP) heads that targets ship in their own checkpoint: how each family declares them, where
their weights are, how many of them vLLM serves, and which of them draftsync can refresh. Torch-free: the target's
description, the plan and the sync read it.

Facts are vLLM 0.32's (`method: mtp`; model_executor/models/*_mtp.py and config/speculative.py):
- the count is a config field (top level, or in a multimodal config's text_config);
- vLLM builds one head module per declared layer but runs only the first for MiMo (it asserts a first draft step) and
  for Qwen3-Next and Qwen3.5 (their forward drops the step index); DeepSeek-V3 and GLM-4.5 cycle through theirs;
- MiMo's head reads the target's last state before its final norm, the others the state after it.

A sync measures, refreshes and registers MiMo-style heads (methods/mtp, flows/sync.py); for the others the plan sizes a
refresh and refuses the sync, naming the way out (serve the head as it ships, method mtp).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from draftsync.errors import DraftsyncError


@dataclass(frozen=True)
class MtpLayout:
    """How one family ships its MTP layers.

    `weight_prefix` is a format string over the target's layer count `n` and the MTP layer `i`; `most_served` is how
    many of them vLLM runs (None: all); `reads` is the target state the head takes ("pre_norm" or "final")."""

    family: str
    architectures: tuple[str, ...]
    count_field: str
    weight_prefix: str
    most_served: int | None
    reads: str
    refreshed_here: bool = False

    def prefixes(self, num_layers: int, count: int) -> list[str]:
        return [self.weight_prefix.format(n=num_layers, i=i, k=num_layers + i) for i in range(count)]


# MiMo's: the layout draftsync's own head (speculative/methods/mtp) reads and writes.
MIMO = MtpLayout("mimo", ("MiMoForCausalLM",), "num_nextn_predict_layers", "model.mtp_layers.{i}.", 1, "pre_norm", True)
MTP_LAYOUTS: tuple[MtpLayout, ...] = (
    MIMO,
    MtpLayout(
        "deepseek_v3", ("DeepseekV3ForCausalLM",), "num_nextn_predict_layers", "model.layers.{k}.", None, "final"
    ),
    MtpLayout("glm4_moe", ("Glm4MoeForCausalLM",), "num_nextn_predict_layers", "model.layers.{k}.", None, "final"),
    MtpLayout("qwen3_next", ("Qwen3NextForCausalLM",), "num_nextn_predict_layers", "mtp.layers.{i}.", 1, "final"),
    MtpLayout(
        "qwen3_5",
        (
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5MoeForConditionalGeneration",
            "Qwen3_5ForCausalLM",
            "Qwen3_5MoeForCausalLM",
        ),
        "mtp_num_hidden_layers",
        "mtp.layers.{i}.",
        1,
        "final",
    ),
)
_BY_ARCHITECTURE = {arch: layout for layout in MTP_LAYOUTS for arch in layout.architectures}


@dataclass(frozen=True)
class MtpHead:
    """A target's own MTP head: its family's layout and the layers its config declares."""

    layout: MtpLayout
    layers: int

    def summary(self) -> dict[str, Any]:
        return {
            "family": self.layout.family,
            "layers": self.layers,
            "served_layers": min(self.layers, self.layout.most_served or self.layers),
            "reads": self.layout.reads,
            "refreshed_by_draftsync": self.layout.refreshed_here,
        }


def mtp_head_of(raw_config: Mapping[str, Any], what: str) -> MtpHead | None:
    """The MTP head `raw_config` declares, None when it declares none; more layers than vLLM serves are refused."""
    architecture = str((raw_config.get("architectures") or [""])[0])
    layout = _BY_ARCHITECTURE.get(architecture)
    if layout is None:
        return None
    text = raw_config.get("text_config") or {}
    count = int(raw_config.get(layout.count_field) or text.get(layout.count_field) or 0)
    if count and layout.most_served is not None and count > layout.most_served:
        raise DraftsyncError(
            f"{what} declares {count} MTP layers ({layout.count_field}), and vLLM serves only "
            f"{layout.most_served} of a {architecture}'s",
            f"set {layout.count_field} to {layout.most_served} in its config.json and keep the first layer's "
            "weights, or register the target without its MTP layers",
        )
    return MtpHead(layout, count) if count else None


def missing_head_weights(head: MtpHead, num_layers: int, names: Iterable[str]) -> list[str]:
    """The weight-name prefixes of declared MTP layers that no tensor in `names` carries."""
    names = list(names)
    return [p for p in head.layout.prefixes(num_layers, head.layers) if not any(n.startswith(p) for n in names)]


def require_head_weights(head: MtpHead, num_layers: int, names: Iterable[str], what: str) -> None:
    """Refuse a target whose config declares MTP layers that its weight files lack (a trunk-only export)."""
    missing = missing_head_weights(head, num_layers, names)
    if missing:
        raise DraftsyncError(
            f"{what} declares {head.layers} MTP layer(s) ({head.layout.count_field}) but its weight files hold no "
            f"tensors under {', '.join(missing)}",
            f"save the checkpoint with its MTP layers, or set {head.layout.count_field} to 0 in its config.json "
            "to sync it without its head",
        )
