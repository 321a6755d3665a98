"""An independent small causal LM as drafter: the `draft_model` baseline the learned drafters must beat.

It is a plain transformers LlamaForCausalLM over the target's vocabulary, reading tokens only (no target
states), so vLLM serves it as `method: "draft_model"`; its checkpoint format is in `checkpoint.py`.

Sizing (`for_budget`): it gets about the parameter count of the drafter it is compared with, so the
comparison is at equal size. Candidate shapes keep the target's head dimension, MLP ratio, attention
grouping and embedding tying: hidden = a multiple of the target's head dim up to the target's hidden size,
1..L layers (L = the target's). The rule: among shapes whose count is within 5% of the budget, the one
whose width per layer (hidden / layers) is closest to the target's, on a log scale; when none is
that close, the shape with the nearest count. Counts include embeddings and lm_head.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from draftsync.errors import DraftsyncError
from draftsync.speculative.data.hidden_states import final_norm_of
from draftsync.speculative.data.training_batch import DraftLoss, TrainingBatch
from draftsync.speculative.methods import DRAFT_MODEL

BUDGET_TOLERANCE = 0.05


def llama_parameter_count(
    vocab: int, hidden: int, layers: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, tied: bool
) -> int:
    """Exact parameter count of a bias-free LlamaForCausalLM of this shape."""
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o: heads; k, v: kv heads
    layer = attention + 3 * hidden * intermediate + 2 * hidden
    return vocab * hidden * (1 if tied else 2) + layers * layer + hidden


def _kv_heads(heads: int, target_heads: int, target_kv_heads: int) -> int:
    """Keep the target's query-to-key/value grouping; the result divides `heads`."""
    kv = max(1, round(heads * target_kv_heads / target_heads))
    while heads % kv:
        kv -= 1
    return kv


def shape_for_budget(target_config: Any, parameters: int) -> dict[str, int]:
    """hidden_size, num_hidden_layers, intermediate_size and head counts by the rule in the module docstring."""
    if parameters <= 0:
        raise DraftsyncError(
            f"draft model parameter budget {parameters} is not positive",
            "give the parameter count of the drafter it is compared with",
        )
    target_heads = target_config.num_attention_heads
    head_dim = getattr(target_config, "head_dim", None) or target_config.hidden_size // target_heads
    target_kv = getattr(target_config, "num_key_value_heads", None) or target_heads
    ratio = target_config.intermediate_size / target_config.hidden_size
    tied = bool(getattr(target_config, "tie_word_embeddings", False))
    target_width = target_config.hidden_size / target_config.num_hidden_layers
    candidates = []
    for heads in range(1, target_config.hidden_size // head_dim + 1):
        hidden = heads * head_dim
        kv = _kv_heads(heads, target_heads, target_kv)
        intermediate = max(1, round(hidden * ratio))
        for layers in range(1, target_config.num_hidden_layers + 1):
            count = llama_parameter_count(
                target_config.vocab_size, hidden, layers, intermediate, heads, kv, head_dim, tied
            )
            miss = abs(count - parameters) / parameters
            aspect = abs(math.log((hidden / layers) / target_width))
            shape = {
                "hidden_size": hidden,
                "num_hidden_layers": layers,
                "intermediate_size": intermediate,
                "num_attention_heads": heads,
                "num_key_value_heads": kv,
                "head_dim": head_dim,
                "parameters": count,
            }
            candidates.append((miss, aspect, shape))
    close = [c for c in candidates if c[0] <= BUDGET_TOLERANCE]
    best = min(close, key=lambda c: (c[1], c[0])) if close else min(candidates, key=lambda c: (c[0], c[1]))
    return best[2]


class DraftModelDrafter(nn.Module):
    """A small LlamaForCausalLM (`self.lm`) behind the drafter interface; `config` is its LlamaConfig,
    which also carries `draft_vocab_size` (= vocab_size: a draft model predicts the whole vocabulary)
    and `target_hidden_size` (of the target it was sized for)."""

    method = DRAFT_MODEL.name
    target_states = "none"
    target_copy_names: tuple[str, ...] = ()  # vLLM serves a draft model with its own embedding and head
    aux_layer_ids: tuple[int, ...] = ()
    fixed_positions: int | None = None  # it drafts token after token, as many as it is asked
    d2t: torch.Tensor | None = None  # it predicts the whole vocabulary

    def __init__(self, config: Any):
        from transformers import LlamaForCausalLM

        from draftsync.speculative.data.hidden_states import cache_keyword

        super().__init__()
        draft_vocab = getattr(config, "draft_vocab_size", None) or config.vocab_size
        if draft_vocab != config.vocab_size:
            raise DraftsyncError(
                f"a draft model with a draft vocabulary of {draft_vocab} of {config.vocab_size} tokens was asked for",
                "build draft_model drafters over the whole vocabulary (vLLM serves them as plain LMs)",
            )
        config.draft_vocab_size = config.vocab_size
        if getattr(config, "target_hidden_size", None) is None:
            config.target_hidden_size = config.hidden_size
        self.lm = LlamaForCausalLM(config)
        self._cache_keyword = cache_keyword(self.lm)

    @property
    def config(self) -> Any:
        return self.lm.config

    @classmethod
    def for_target(cls, target_config: Any, **shape: int) -> DraftModelDrafter:
        """A draft model over the target's vocabulary, positions and norms, with the shape given."""
        from transformers import LlamaConfig

        head_dim = shape.get("head_dim") or (target_config.hidden_size // target_config.num_attention_heads)
        rope = getattr(target_config, "rope_parameters", None)
        extra: dict[str, Any] = {"rope_parameters": dict(rope)} if isinstance(rope, dict) else {}
        # draft_vocab_size and target_hidden_size are not LlamaConfig fields: transformers configs keep extra
        # keyword arguments as attributes (accept_kwargs), which their dataclass_transform typing does not show.
        config = LlamaConfig(  # type: ignore[call-arg]
            vocab_size=target_config.vocab_size,
            hidden_size=shape["hidden_size"],
            num_hidden_layers=shape["num_hidden_layers"],
            intermediate_size=shape["intermediate_size"],
            num_attention_heads=shape["num_attention_heads"],
            num_key_value_heads=shape.get("num_key_value_heads", shape["num_attention_heads"]),
            head_dim=head_dim,
            rms_norm_eps=target_config.rms_norm_eps,
            max_position_embeddings=target_config.max_position_embeddings,
            tie_word_embeddings=bool(getattr(target_config, "tie_word_embeddings", False)),
            bos_token_id=getattr(target_config, "bos_token_id", None),
            eos_token_id=getattr(target_config, "eos_token_id", None),
            pad_token_id=getattr(target_config, "pad_token_id", None),
            draft_vocab_size=target_config.vocab_size,
            target_hidden_size=target_config.hidden_size,
            **extra,
        )
        return cls(config)

    @classmethod
    def for_budget(cls, target_config: Any, parameters: int, draft_vocab_size: int | None = None) -> DraftModelDrafter:
        """A draft model of about `parameters` parameters (see the module docstring for the rule)."""
        if draft_vocab_size not in (None, target_config.vocab_size):
            raise DraftsyncError(
                f"a draft model with a draft vocabulary of {draft_vocab_size} tokens was asked for",
                "leave draft_vocab_size unset for draft_model drafters (vLLM serves them as plain LMs "
                "over the target's whole vocabulary)",
            )
        return cls.for_target(target_config, **shape_for_budget(target_config, parameters))

    # ---- vocabulary: always the target's whole vocabulary -----------------------------------------
    @property
    def draft_token_ids(self) -> torch.Tensor:
        return torch.arange(self.config.vocab_size)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids

    def set_draft_vocab(self, d2t: torch.Tensor | None, t2d: torch.Tensor | None) -> None:
        if d2t is not None and (d2t.shape[0] != self.config.vocab_size or bool(d2t.any())):
            raise DraftsyncError(
                "a draft vocabulary mapping was given to a draft model, which predicts the whole vocabulary",
                "train draft_model drafters without a draft vocabulary",
            )

    # ---- initialisation -----------------------------------------------------------------------------
    def initialise_from_target(self, target_model: Any, freeze_embeddings: bool = True) -> None:
        """Copy the target's embeddings, lm_head and final norm where the shapes match (same hidden size)."""
        with torch.no_grad():
            embed, source = self.lm.model.embed_tokens.weight, target_model.get_input_embeddings().weight
            if embed.shape == source.shape:
                embed.copy_(source)
                embed.requires_grad_(not freeze_embeddings)
            head, source = self.lm.lm_head.weight, target_model.get_output_embeddings().weight
            if head is not embed and head.shape == source.shape:
                head.copy_(source)
            norm, source = self.lm.model.norm.weight, final_norm_of(target_model).weight
            if norm.shape == source.shape:
                norm.copy_(source)

    # ---- inference ----------------------------------------------------------------------------------
    def new_cache(self) -> Any:
        from draftsync.speculative.data.hidden_states import new_kv_cache

        return new_kv_cache(self.lm)

    def forward(self, input_ids: torch.Tensor, cache: Any = None) -> torch.Tensor:
        """Logits [B,T,V] of `input_ids`, after what `cache` holds (and appended to it) when given."""
        if cache is None:
            return self.lm(input_ids=input_ids, use_cache=False).logits
        return self.lm(input_ids=input_ids, use_cache=True, **{self._cache_keyword: cache}).logits

    # ---- training -----------------------------------------------------------------------------------
    def training_loss(
        self, batch: TrainingBatch, ttt_steps: int = 1, noise_std: float = 0.0, generator: torch.Generator | None = None
    ) -> DraftLoss:
        """Soft cross-entropy of row t's logits against the target's distribution at t (token t+1),
        over rows whose token t+1 is loss-masked. One draft position; `ttt_steps` and `noise_std` (for
        drafters fed target states) do not apply to a model that reads tokens only."""
        target_logits = batch.filled_target_logits()
        logits = self.lm(input_ids=batch.ids, attention_mask=batch.valid.long(), use_cache=False).logits
        mask = batch.loss_mask[:, 1:]
        rows = logits[:, :-1][mask].float()
        targets = target_logits[:, :-1][mask].to(rows.device).float()
        if rows.shape[0] == 0:
            return DraftLoss(total=logits.sum() * 0.0, position_losses=[0.0], position_hits=[0], position_counts=[0])
        loss = -(torch.softmax(targets, -1) * torch.log_softmax(rows, -1)).sum(-1).mean()
        hits = int((rows.argmax(-1) == targets.argmax(-1)).sum())
        return DraftLoss(
            total=loss,
            position_losses=[float(loss.detach())],
            position_hits=[hits],
            position_counts=[int(rows.shape[0])],
        )
