"""What every method's proposer shares: the `Proposer` protocol the engine drives, and the helpers of drafting.

A proposer is how a drafter turns what is committed into the tokens the target verifies; each method's lives in its
package, and the registry (registry.py `make_proposer`) gives a drafter its own. The engine (engine/decoding.py) owns
verification, the target's KV cache and the counters; a proposer owns drafting. It is told which target states it
reads (`target_states`: "aux" for EAGLE-3, "final" for EAGLE-1 and Medusa, "none" for n-gram lookup and an
independent draft model), so the engine captures only those. Each request gets its own proposer state (a drafter KV
cache, a token buffer, or nothing).

`propose(committed, pending_states, state, gamma, temperature, generator)` returns up to `gamma` target
token ids and, at T>0, each proposal's distribution over the target vocabulary (the q of rejection
sampling; empty at T=0). `committed` is the whole sequence so far: the target has run every position
but the last one. `pending_states` [n, D] are the target's states of the n positions it verified since
the previous call (None for "none"); a proposer that keeps its own cache consumes them there. A short
or empty proposal is allowed: the engine verifies what there is, and an empty one is no draft at all.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from draftsync.errors import DraftsyncError


class Proposer(Protocol):
    method: str
    target_states: str  # "aux", "final" or "none"
    aux_layer_ids: tuple[int, ...]  # read by the engine when target_states == "aux"

    def check_target(self, target_model: Any) -> None:
        """Raise DraftsyncError when the drafter was not built for this target."""

    def new_state(self) -> Any:
        """Per-request drafting state."""

    def propose(
        self,
        committed: list[int],
        pending_states: torch.Tensor | None,
        state: Any,
        gamma: int,
        temperature: float,
        generator: torch.Generator,
    ) -> tuple[list[int], list[torch.Tensor]]: ...


# ---- helpers ------------------------------------------------------------------------------------------
def check_vocabulary(drafter: Any, target_model: Any) -> None:
    drafter_vocab, target_vocab = drafter.config.vocab_size, target_model.config.vocab_size
    if drafter_vocab != target_vocab:
        raise DraftsyncError(
            f"drafter vocabulary ({drafter_vocab}) differs from the target's ({target_vocab})",
            "serve the drafter trained for this target version, or speculation off",
        )


def check_target_states(drafter: Any, target_model: Any, states: str, aux_layer_ids: tuple[int, ...]) -> None:
    """The drafter reads hidden states of the target's width, at depths the target has."""
    from draftsync.speculative.data.hidden_states import num_decoder_layers

    check_vocabulary(drafter, target_model)
    if states == "none":
        return
    width, layers = target_model.config.hidden_size, num_decoder_layers(target_model)
    expected = drafter.config.target_hidden_size
    if expected != width or (states == "aux" and max(aux_layer_ids) > layers):
        depths = f" and layers {list(aux_layer_ids)}" if states == "aux" else ""
        raise DraftsyncError(
            f"drafter expects a target with hidden size {expected}{depths}; this target has {width} and {layers}",
            "serve the drafter trained for this target version, or speculation off",
        )


def full_distribution(q: torch.Tensor, draft_token_ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """A draft-vocabulary distribution laid out over the whole target vocabulary (zeros elsewhere)."""
    if draft_token_ids is None or q.shape[-1] == vocab_size:
        return q
    full = torch.zeros(vocab_size, dtype=q.dtype)
    full[draft_token_ids] = q
    return full


def pick(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> tuple[int, torch.Tensor | None]:
    """(index, distribution): argmax at T=0 (no distribution), else a draw from softmax(logits / T)."""
    if temperature <= 0:
        return int(logits.argmax()), None
    q = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(q, 1, generator=generator)), q
