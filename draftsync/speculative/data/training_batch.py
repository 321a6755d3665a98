"""What every drafter's training step consumes and returns, whatever the method.

One batch type and one loss type let the trainer, the shard reader and the four drafter families
(EAGLE-3, EAGLE-1, Medusa, independent draft model) meet at a single seam.

Alignment: `target_logits[:, t]` is the target's distribution over token t+1. EAGLE-style drafters
predict, at row t, token t+2 from (state at t, token t+1); Medusa head k at row t predicts token t+2+k;
a draft model at row t predicts token t+1. Losses are masked by `loss_mask` of the predicted token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from draftsync.errors import DraftsyncError


@dataclass
class TrainingBatch:
    """B windows of T tokens with the target's states for them (states float32 in memory).

    `target_logits` is None when the batch comes straight from shards: logits ([B,T,V]) are far larger
    than the states, so they are not stored; the trainer fills them with the target's lm_head(final).
    """

    ids: Tensor  # [B,T] long, padded with 0
    valid: Tensor  # [B,T] bool, real tokens
    loss_mask: Tensor  # [B,T] bool, positions whose token is a training target (already & valid)
    aux: Tensor | None  # [B,T,3H] float32; None when the dataset was built without aux states
    final: Tensor  # [B,T,H] float32, the target's post-norm last hidden state
    target_logits: Tensor | None = None  # [B,T,V] float32 = lm_head(final): distribution after token t
    # When the trainer fills the logits over the draft vocabulary only ([B,T,Dv], the target's lm_head rows of the
    # drafter's `d2t`): the target ids of those columns, and the target's greedy token over its whole vocabulary.
    target_columns: Tensor | None = None  # [Dv] long; None: target_logits covers the whole vocabulary
    target_top: Tensor | None = None  # [B,T] long; None: target_logits.argmax(-1)

    def target_greedy(self) -> Tensor:
        """The target's greedy token after each position, over its whole vocabulary: what agreement is counted on."""
        return self.target_top if self.target_top is not None else self.filled_target_logits().argmax(-1)

    def filled_target_logits(self) -> Tensor:
        """`target_logits`, which every drafter's loss needs and the trainer fills in."""
        if self.target_logits is None:
            raise DraftsyncError(
                "the training batch has no target logits",
                "fill batch.target_logits with the target's lm_head(final) before the loss",
            )
        return self.target_logits


@dataclass
class DraftLoss:
    """A drafter's loss on one batch, with per-position agreement counts for acceptance estimates."""

    total: Tensor  # scalar to backprop: the positions' losses summed (as the family weighs them)
    position_losses: list[float]  # per draft position (TTT step for EAGLE, head k for Medusa)
    position_hits: list[int]  # positions where the drafter's top-1 equals the target's greedy token
    position_counts: list[int]  # positions counted (loss-masked)
    # (draft position, its differentiable loss) for chained drafters, which the trainer may weigh by position;
    # empty where the family weighs its positions itself (Medusa's loss_decay) or has only one.
    chain_terms: list[tuple[int, Tensor]] = field(default_factory=list)

    def weighted_total(self, position_decay: float) -> Tensor:
        """The loss with draft position k weighed by position_decay**k (1.0: `total`).

        SpecForge weighs its training-time-test steps 0.8**k: the first positions decide most of an acceptance
        length, since a later one counts only once every earlier one was accepted."""
        if position_decay == 1.0 or not self.chain_terms:
            return self.total
        return torch.stack([position_decay**k * term for k, term in self.chain_terms]).sum()
