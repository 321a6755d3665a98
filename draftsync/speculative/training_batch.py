"""What a drafter trains on (`TrainingBatch`) and what its loss reports (`DraftLoss`).

Alignment: target_logits[:, t] is the target's distribution over token t+1.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class TrainingBatch:
    ids: Tensor  # [B,T] long, padded with 0
    valid: Tensor  # [B,T] bool, real tokens
    loss_mask: Tensor  # [B,T] bool, positions whose token is a training target (already & valid)
    aux: Tensor | None  # [B,T,3H] float32 (None when the dataset was built without aux states)
    final: Tensor  # [B,T,H] float32, target's post-norm last hidden state
    target_logits: Tensor  # [B,T,V] float32, = target lm_head(final): the target's distribution after token t


@dataclass
class DraftLoss:
    total: Tensor  # scalar to backprop
    position_losses: list[float]  # per draft position (TTT step for EAGLE, head k for Medusa)
    position_hits: list[int]  # positions where the drafter's top-1 equals the target's greedy token
    position_counts: list[int]  # positions counted (loss-masked)
