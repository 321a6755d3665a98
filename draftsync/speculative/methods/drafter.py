"""What a drafter is to the code around it, whatever its method: the `Drafter` protocol.

Callers read a drafter through these members, never by probing its class or its config for a method's fields: which
method it is, which of the target's states it reads (and at which layers), which of its tensors are frozen copies of
the target's, how many positions it drafts at once, and its draft vocabulary. Its `config` carries at least
`vocab_size` (the target's), `draft_vocab_size` and `target_hidden_size`. Every drafter is also a torch module
(parameters, state_dict, to, train, eval), which the trainer and the checkpoint formats use as such.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


class Drafter(Protocol):
    @property
    def method(self) -> str:
        """Its method's name (a key of `draftsync.speculative.methods.METHODS`)."""

    @property
    def target_states(self) -> str:
        """What it reads of the target: "aux" (its aux layers' states), "final" (the post-norm last state) or
        "none" (tokens only)."""

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        """The target layers whose states it reads when `target_states` is "aux"; empty otherwise."""

    @property
    def target_copy_names(self) -> tuple[str, ...]:
        """Its tensors that are frozen copies of the target's, which serving takes from the target."""

    @property
    def fixed_positions(self) -> int | None:
        """How many positions one draft proposes when that is fixed (Medusa: one per head); None for a drafter
        that chains, one position after another, as far as it is asked."""

    @property
    def config(self) -> Any:
        """Its shapes: `vocab_size` (the target's), `draft_vocab_size`, `target_hidden_size` and its method's own."""

    @property
    def d2t(self) -> torch.Tensor | None:
        """Offsets from draft-vocabulary entries to target ids (target id = i + d2t[i]); None over the whole
        vocabulary."""

    @property
    def draft_token_ids(self) -> torch.Tensor:
        """The target id of each draft-vocabulary entry, ascending."""

    def set_draft_vocab(self, d2t: torch.Tensor | None, t2d: torch.Tensor | None) -> None:
        """Set the draft vocabulary (from `data.draft_vocab.build_draft_vocab`)."""

    def initialise_from_target(self, target: Any, freeze_embeddings: bool = True) -> None:
        """Start from the target's own tensors where the shapes allow (its embedding, head, final norm)."""
