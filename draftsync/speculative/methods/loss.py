"""Loss terms every drafter shares: soft cross-entropy to the target's distribution, agreement counts, noise.

A drafter is judged by whether the target accepts its tokens, so it learns the target's whole next-token
distribution (restricted to the draft vocabulary) rather than the corpus' hard labels, and its agreement
is counted against the target's greedy token: the proxy for acceptance at T=0.

Alignment: target_logits[:, t] is the target's distribution over token t+1. A prediction made at row t
with `offset` o is compared with target_logits[:, t+o] and weighted by loss_mask[:, t+o+1] (the mask of
the token it predicts); rows run while t+o+1 is inside the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from draftsync.errors import DraftsyncError

if TYPE_CHECKING:
    from draftsync.speculative.data.training_batch import TrainingBatch


# Rows of the loss held in fp32 at once: the softmaxes over the draft vocabulary are never whole ([tokens x Dv]).
LOSS_CHUNK_ELEMENTS = 1 << 24


class _SoftCrossEntropy(torch.autograd.Function):
    """-sum p_target * log q_draft per row, weighted mean, computed chunk by chunk in fp32.

    Backward recomputes each chunk's softmaxes instead of keeping them: d/dx of the row loss is
    softmax(x) - p_target (p_target sums to 1), so autograd holds only the inputs, in their own dtype."""

    @staticmethod
    def forward(ctx, draft_logits, target_logits, weight, chunk_rows):
        weight = weight.float()
        denominator = weight.sum().clamp_min(1.0)
        total = torch.zeros((), device=draft_logits.device, dtype=torch.float32)
        for rows in _chunks(draft_logits.shape[:-1], chunk_rows):
            target_probs = torch.softmax(target_logits[rows].float(), dim=-1)
            per_row = -(target_probs * torch.log_softmax(draft_logits[rows].float(), dim=-1)).sum(-1)
            total = total + (per_row * weight[rows]).sum()
        ctx.save_for_backward(draft_logits, target_logits, weight, denominator)
        ctx.chunk_rows = chunk_rows
        return total / denominator

    @staticmethod
    def backward(ctx, grad_output):
        draft_logits, target_logits, weight, denominator = ctx.saved_tensors
        grad = torch.empty_like(draft_logits)
        scale = grad_output / denominator
        for rows in _chunks(draft_logits.shape[:-1], ctx.chunk_rows):
            difference = torch.softmax(draft_logits[rows].float(), -1) - torch.softmax(target_logits[rows].float(), -1)
            grad[rows] = (difference * (weight[rows] * scale).unsqueeze(-1)).to(grad.dtype)
        return grad, None, None, None


def _chunks(leading: torch.Size, chunk_rows: int):
    """Index tuples over a [B, R] grid of rows, at most `chunk_rows` rows each (whole batch rows when they fit)."""
    batch, rows = leading
    if rows == 0:
        return
    if rows <= chunk_rows:
        per_chunk = chunk_rows // rows
        for b in range(0, batch, per_chunk):
            yield (slice(b, b + per_chunk),)
        return
    for b in range(batch):
        for r in range(0, rows, chunk_rows):
            yield (b, slice(r, r + chunk_rows))


def soft_cross_entropy(draft_logits: torch.Tensor, target_logits: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Mean over weighted rows of -sum p_target * log q_draft, both [B, R, Dv] over the same (draft) vocabulary."""
    chunk_rows = max(1, LOSS_CHUNK_ELEMENTS // max(1, draft_logits.shape[-1]))
    return _SoftCrossEntropy.apply(draft_logits, target_logits.detach(), weight, chunk_rows)


def masked_mean(per_row: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Mean of a [B, R] per-row loss over the rows `weight` selects (0 when none is)."""
    weight = weight.float()
    return (per_row.float() * weight).sum() / weight.sum().clamp_min(1.0)


def gaussian_noise(like: torch.Tensor, std: float, generator: torch.Generator | None) -> torch.Tensor:
    """std * N(0, 1) shaped like `like`, drawn from `generator` (on its device), moved to `like`'s device."""
    device = generator.device if generator is not None else like.device
    return (std * torch.randn(like.shape, generator=generator, device=device)).to(like.device)


def prediction_rows(length: int, offset: int) -> int:
    """How many rows of a window of `length` tokens have a target for predictions at `offset`."""
    return max(0, length - offset - 1)


@dataclass
class PositionTerms:
    """One draft position's soft cross-entropy (None when no row has a target) and agreement counts."""

    loss: torch.Tensor | None
    hits: int
    count: int


def distribution_terms(
    draft_logits: torch.Tensor,
    batch: TrainingBatch,
    offset: int,
    draft_token_ids: torch.Tensor | None,
    to_target_ids,
) -> PositionTerms:
    """Soft cross-entropy and top-1 agreement of predictions `draft_logits` [B, >=R, Dv] made at `offset`.

    `draft_token_ids` are the target ids of the draft vocabulary (None for the whole vocabulary);
    `to_target_ids` maps draft ids to target ids. The batch's target logits are either over the whole
    vocabulary or already over the draft vocabulary (`batch.target_columns`).
    """
    target_logits = batch.filled_target_logits()
    rows = prediction_rows(target_logits.shape[1], offset)
    if rows == 0:
        return PositionTerms(None, 0, 0)
    predicted = draft_logits[:, :rows]
    target = target_logits[:, offset : offset + rows]
    weight = batch.loss_mask[:, offset + 1 : offset + 1 + rows]
    if draft_token_ids is not None and batch.target_columns is None:
        target = target.index_select(-1, draft_token_ids.to(target.device))
    elif target.shape[-1] != predicted.shape[-1]:
        raise DraftsyncError(
            f"the target's logits cover {target.shape[-1]} tokens and the drafter's {predicted.shape[-1]}",
            "fill the batch's target logits over the drafter's own draft vocabulary",
        )
    loss = soft_cross_entropy(predicted, target, weight)
    with torch.no_grad():
        greedy = batch.target_greedy()[:, offset : offset + rows]
        agree = to_target_ids(predicted.argmax(-1)).to(greedy.device) == greedy
        weight = weight.bool()
        hits, count = int((agree & weight).sum()), int(weight.sum())
    return PositionTerms(loss, hits, count)


def check_window(length: int, ttt_steps: int) -> None:
    if ttt_steps < 1:
        raise DraftsyncError(f"ttt_steps={ttt_steps} is below 1", "use ttt_steps >= 1")
    if length < 3:
        raise DraftsyncError(
            f"a training window of {length} tokens has no position a drafter can learn (3 or more are needed)",
            "build training windows of at least 3 tokens",
        )
