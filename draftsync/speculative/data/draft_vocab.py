"""The draft vocabulary: the target ids a drafter's head predicts, as the d2t/t2d buffers store them.

A smaller head makes every draft step and every training step cheaper; the ids kept are the most
frequent among the tokens the drafter is trained to predict (loss-masked tokens). EAGLE-3 and Medusa
heads store the mapping the same way (`DraftVocabBuffers`), under the names EAGLE-3 checkpoints use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from draftsync.errors import DraftsyncError

if TYPE_CHECKING:
    import torch
    from torch import nn

    _Module = nn.Module  # what the mixin is mixed into; at run time it stays a plain class
else:
    _Module = object


def check_draft_vocab_size(draft_vocab_size: int, vocab_size: int) -> None:
    """The size rule of every draft vocabulary, for the builder and the drafter configs alike: 1..V target ids."""
    if not 0 < draft_vocab_size <= vocab_size:
        raise DraftsyncError(
            f"draft vocabulary size {draft_vocab_size} is not within 1..{vocab_size} (the target's vocabulary)",
            "choose a draft vocabulary no larger than the target vocabulary",
        )


def build_draft_vocab(
    token_counts: torch.Tensor, draft_vocab_size: int
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(d2t int64 [Dv], t2d bool [V]) for the Dv most frequent ids, sorted; (None, None) when Dv == V.

    Ties are broken towards the lower id, so the result is deterministic; target id = i + d2t[i].
    """
    import torch

    vocab_size = int(token_counts.shape[0])
    check_draft_vocab_size(draft_vocab_size, vocab_size)
    if draft_vocab_size == vocab_size:
        return None, None
    order = torch.sort(token_counts.to(torch.long), descending=True, stable=True).indices
    kept = torch.sort(order[:draft_vocab_size]).values
    d2t = kept - torch.arange(draft_vocab_size, dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[kept] = True
    return d2t, t2d


class DraftVocabConfig(Protocol):
    """The config fields DraftVocabBuffers reads."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def draft_vocab_size(self) -> int: ...


class DraftVocabBuffers(_Module):
    """The d2t/t2d buffers and id mapping of a drafter module whose head may cover part of the vocabulary.

    Mixed into an nn.Module with `config.vocab_size` and `config.draft_vocab_size`; one implementation so
    that every such drafter saves, checks and maps its draft vocabulary alike.
    """

    config: DraftVocabConfig
    d2t: torch.Tensor | None
    t2d: torch.Tensor | None

    def register_draft_vocab(self) -> None:
        """d2t int64 [Dv] and t2d bool [V] buffers (saved with the weights) when Dv < V; None when Dv == V."""
        import torch

        config = self.config
        if config.draft_vocab_size < config.vocab_size:
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        else:
            self.d2t = None
            self.t2d = None

    def set_draft_vocab(self, d2t: torch.Tensor | None, t2d: torch.Tensor | None) -> None:
        if self.d2t is None or self.t2d is None:  # registered together: both or neither
            if d2t is not None:
                raise DraftsyncError(
                    "a draft vocabulary mapping was given to a drafter whose head covers the whole vocabulary",
                    "build the drafter with draft_vocab_size equal to the mapping's length",
                )
            return
        if d2t is None or t2d is None or d2t.shape != self.d2t.shape or t2d.shape != self.t2d.shape:
            raise DraftsyncError(
                f"draft vocabulary mapping does not fit the drafter (d2t [{self.config.draft_vocab_size}], "
                f"t2d [{self.config.vocab_size}] expected)",
                "build d2t/t2d with build_draft_vocab for this drafter's draft_vocab_size",
            )
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    @property
    def draft_token_ids(self) -> torch.Tensor:
        """Target id of each draft-vocabulary entry, ascending: i + d2t[i]."""
        import torch

        device = (next(self.parameters()) if self.d2t is None else self.d2t).device
        base = torch.arange(self.config.draft_vocab_size, device=device)
        return base if self.d2t is None else base + self.d2t

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]
