"""The n-gram proposer: prompt lookup as vLLM's `ngram` method does it, with no model."""

from __future__ import annotations

from typing import Any

import torch

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import NGRAM


class _TokenBuffer:
    """The committed tokens as a growing int64 array: each step converts only the new tokens."""

    def __init__(self) -> None:
        import numpy as np

        self.array = np.zeros(256, dtype=np.int64)
        self.length = 0

    def sync(self, committed: list[int]):
        import numpy as np

        total = len(committed)
        if total > self.array.shape[0]:
            grown = np.zeros(max(total, 2 * self.array.shape[0]), dtype=np.int64)
            grown[: self.length] = self.array[: self.length]
            self.array = grown
        if total > self.length:
            self.array[self.length : total] = committed[self.length : total]
            self.length = total
        return self.array[:total]


class NgramProposer:
    """Prompt lookup as vLLM's `ngram` method does it (`vllm/v1/spec_decode/ngram_proposer.py`).

    The longest suffix of the context of length n in [prompt_lookup_min, prompt_lookup_max] that occurs
    earlier (its earliest occurrence, the match ending before the last token) proposes the tokens that
    followed it, up to gamma, fewer when the match lies near the end. No match: no proposal, which vLLM
    counts as no draft at all (nothing scheduled, nothing observed); a short one counts its own length.
    Defaults follow vLLM: both 5 when neither is given, one given sets the other.
    """

    method = NGRAM.name
    target_states = "none"
    aux_layer_ids: tuple[int, ...] = ()

    def __init__(self, prompt_lookup_min: int | None = None, prompt_lookup_max: int | None = None):
        low = prompt_lookup_min if prompt_lookup_min is not None else prompt_lookup_max
        high = prompt_lookup_max if prompt_lookup_max is not None else prompt_lookup_min
        if low is None or high is None:  # neither given
            low = high = 5
        if not 1 <= low <= high:
            raise DraftsyncError(
                f"n-gram lookup lengths min={low}, max={high} are not 1 <= min <= max",
                "choose prompt_lookup_min >= 1 and prompt_lookup_max >= prompt_lookup_min",
            )
        self.min_n, self.max_n = int(low), int(high)
        self.vocab_size = 0  # set by check_target

    def check_target(self, target_model: Any) -> None:
        self.vocab_size = int(target_model.config.vocab_size)  # the one-hot q of each proposal spans it

    def new_state(self) -> _TokenBuffer:
        return _TokenBuffer()

    def propose(self, committed, pending_states, state, gamma, temperature, generator):
        proposals = lookup(state.sync(committed), self.min_n, self.max_n, gamma)
        if temperature <= 0 or not proposals:
            return proposals, []
        return proposals, [one_hot(token, self.vocab_size) for token in proposals]


def one_hot(token: int, vocab_size: int) -> torch.Tensor:
    """A deterministic proposal's q: rejection sampling then keeps it with probability p(token)."""
    q = torch.zeros(vocab_size)
    q[token] = 1.0
    return q


def lookup(tokens: Any, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k tokens that followed the earliest occurrence of the longest matching suffix n-gram.

    Vectorised over the candidate ends (earlier positions holding the last token): the match length
    of each grows one token at a time up to max_n, so the cost is O(candidates * max_n).
    """
    import numpy as np

    total = tokens.shape[0]
    if total < min_n + 1 or k <= 0:
        return []
    ends = np.flatnonzero(tokens[: total - 1] == tokens[total - 1])  # a match must end before the last token
    if ends.size == 0:
        return []
    lengths = np.ones(ends.shape[0], dtype=np.int64)
    for back in range(1, max_n):
        earlier = ends - back
        extend = (lengths == back) & (earlier >= 0)
        if not extend.any():
            break
        extend[extend] = tokens[earlier[extend]] == tokens[total - 1 - back]
        lengths += extend
    longest = int(lengths.max())
    if longest < min_n:
        return []
    start = int(ends[int(np.argmax(lengths == longest))]) + 1  # earliest end with the longest match
    return tokens[start : start + k].tolist()
