"""The draft vocabulary: the target ids an EAGLE-3 head predicts, as the d2t/t2d buffers store them.

A smaller head makes every draft step and every training step cheaper; the ids kept are the most
frequent among the tokens the drafter is trained to predict (loss-masked tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftsync.errors import DraftsyncError

if TYPE_CHECKING:
    import torch


def count_tokens(sequences: list[list[int]], loss_masks: list[list[int]] | None, vocab_size: int) -> "torch.Tensor":
    """Occurrences of each target id among loss-masked tokens (all tokens without masks)."""
    import torch

    counts = torch.zeros(vocab_size, dtype=torch.long)
    for index, sequence in enumerate(sequences):
        ids = torch.as_tensor(sequence, dtype=torch.long)
        if loss_masks is not None:
            ids = ids[torch.as_tensor(loss_masks[index], dtype=torch.bool)]
        counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def build_draft_vocab(
    token_counts: "torch.Tensor", draft_vocab_size: int
) -> tuple["torch.Tensor | None", "torch.Tensor | None"]:
    """(d2t int64 [Dv], t2d bool [V]) for the Dv most frequent ids, sorted; (None, None) when Dv == V.

    Ties are broken towards the lower id, so the result is deterministic; target id = i + d2t[i].
    """
    import torch

    vocab_size = int(token_counts.shape[0])
    if not 0 < draft_vocab_size <= vocab_size:
        raise DraftsyncError(
            f"draft vocabulary size {draft_vocab_size} is not within 1..{vocab_size} (the target vocabulary)",
            "choose a draft vocabulary size no larger than the target's vocabulary",
        )
    if draft_vocab_size == vocab_size:
        return None, None
    order = torch.sort(token_counts.to(torch.long), descending=True, stable=True).indices
    kept = torch.sort(order[:draft_vocab_size]).values
    d2t = kept - torch.arange(draft_vocab_size, dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[kept] = True
    return d2t, t2d
