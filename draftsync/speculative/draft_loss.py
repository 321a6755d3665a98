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

import torch

from draftsync.errors import DraftsyncError


def soft_cross_entropy(draft_logits: torch.Tensor, target_logits: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Mean over weighted rows of -sum p_target * log q_draft, both over the same (draft) vocabulary."""
    target_probs = torch.softmax(target_logits.float(), dim=-1)
    per_row = -(target_probs * torch.log_softmax(draft_logits.float(), dim=-1)).sum(-1)
    weight = weight.float()
    return (per_row * weight).sum() / weight.sum().clamp_min(1.0)


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
    target_logits: torch.Tensor,
    loss_mask: torch.Tensor,
    offset: int,
    draft_token_ids: torch.Tensor | None,
    to_target_ids,
) -> PositionTerms:
    """Soft cross-entropy and top-1 agreement of predictions `draft_logits` [B, >=R, Dv] made at `offset`.

    `draft_token_ids` are the target ids of the draft vocabulary (None for the whole vocabulary);
    `to_target_ids` maps draft ids to target ids.
    """
    rows = prediction_rows(target_logits.shape[1], offset)
    if rows == 0:
        return PositionTerms(None, 0, 0)
    predicted = draft_logits[:, :rows]
    target = target_logits[:, offset : offset + rows]
    weight = loss_mask[:, offset + 1 : offset + 1 + rows]
    restricted = target if draft_token_ids is None else target.index_select(-1, draft_token_ids.to(target.device))
    loss = soft_cross_entropy(predicted, restricted, weight)
    with torch.no_grad():
        agree = to_target_ids(predicted.argmax(-1)).to(target.device) == target.argmax(-1)
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
