"""Proposers: how each kind of drafter turns what is committed into the tokens the target verifies.

The engine (engine/decoding.py) owns verification, the target's KV cache and the counters; a proposer owns
drafting. It is told which target states it reads (`target_states`: "aux" for EAGLE-3, "final" for
EAGLE-1 and Medusa, "none" for n-gram lookup and an independent draft model), so the engine captures
only those. Each request gets its own proposer state (a drafter KV cache, a token buffer, or nothing).

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
from draftsync.speculative.methods import DRAFT_MODEL, MEDUSA, METHODS, NGRAM, eagle3_variant

CHAIN_METHODS = tuple(method.name for method in METHODS.values() if method.chains)


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
def drafter_method(drafter: Any) -> str:
    """The drafter's method name; an Eagle3Drafter without the attribute is named from its flags."""
    method = getattr(drafter, "method", None)
    if method:
        return str(method)
    from draftsync.speculative.methods.eagle3.model import Eagle3Drafter

    if isinstance(drafter, Eagle3Drafter):
        return eagle3_variant(drafter.config.fc_norm, drafter.config.norm_output)
    raise DraftsyncError(
        f"{type(drafter).__name__} names no speculative method (no `method` attribute)",
        "pass an Eagle3Drafter, EagleDrafter, MedusaDrafter, DraftModelDrafter or a proposer",
    )


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
    expected = getattr(drafter.config, "target_hidden_size", width)
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


# ---- EAGLE-3 / EAGLE 3.1 / EAGLE-1: one draft step per token, on the drafter's own KV cache -------------
class ChainProposer:
    """Drafts token by token with a drafter of the EAGLE interface.

    `drafter.fuse(states)` turns target states into its hidden state and `drafter(ids, hidden, positions,
    cache)` returns (draft-vocabulary logits, the state to feed back). Position t pairs token t+1 with the
    state at t (the EAGLE shift), so the verified positions the cache lacks are caught up in one pass,
    then each proposal is fed back with the drafter's own state. The cache is cropped back to the
    verified positions afterwards: proposals are never kept, accepted ones come back as verified.
    """

    def __init__(self, drafter: Any):
        self.drafter = drafter.eval()
        self.method = drafter_method(drafter)
        states = getattr(drafter, "target_states", None)
        if states is None:
            states = "aux" if hasattr(drafter.config, "aux_layer_ids") else "final"
        if states not in ("aux", "final"):
            raise DraftsyncError(
                f"a chain drafter reading target states {states!r} cannot be drafted from",
                "give an EAGLE-style drafter (target_states 'aux' or 'final')",
            )
        self.target_states = states
        self.aux_layer_ids = tuple(getattr(drafter.config, "aux_layer_ids", ())) if states == "aux" else ()
        self._dtype = next(drafter.parameters()).dtype

    def check_target(self, target_model: Any) -> None:
        check_target_states(self.drafter, target_model, self.target_states, self.aux_layer_ids)

    def new_state(self) -> Any:
        new_cache = getattr(self.drafter, "new_cache", None)
        if new_cache is not None:
            return new_cache()
        from draftsync.speculative.methods.eagle3.model import DrafterKVCache

        return DrafterKVCache()

    def propose(self, committed, pending_states, state, gamma, temperature, generator):
        drafter, cache = self.drafter, state
        verified = len(committed) - 1  # positions the target has run; committed[-1] is not run yet
        start = cache.length
        ids = torch.tensor([committed[start + 1 : verified + 1]])
        hidden = drafter.fuse(pending_states.to(self._dtype)[None])
        logits, hidden = drafter(ids, hidden, torch.arange(start, verified), cache)
        proposals: list[int] = []
        distributions: list[torch.Tensor] = []
        for j in range(gamma):
            index, q = pick(logits[0, -1].float(), temperature, generator)
            if q is not None:
                distributions.append(full_distribution(q, drafter.draft_token_ids, drafter.config.vocab_size))
            token = int(drafter.to_target_ids(torch.tensor(index)))
            proposals.append(token)
            if j + 1 < gamma:
                logits, hidden = drafter(torch.tensor([[token]]), hidden[:, -1:], torch.tensor([verified + j]), cache)
        cache.crop(verified)
        return proposals, distributions


# ---- Medusa: K heads read one state and propose K tokens at once ------------------------------------------
class MedusaProposer:
    """Head k reads the target's final state at the last verified position and proposes the token k+1
    places after the one the target itself just chose: min(gamma, K) proposals from one forward.

    At T>0 each head is sampled on its own; its softmax is that proposal's q (it does not depend on the
    earlier proposals, which rejection sampling allows: the output still follows the target exactly).
    """

    method = MEDUSA.name
    target_states = "final"
    aux_layer_ids: tuple[int, ...] = ()

    def __init__(self, drafter: Any):
        self.drafter = drafter.eval()
        self._dtype = next(drafter.parameters()).dtype

    def check_target(self, target_model: Any) -> None:
        check_target_states(self.drafter, target_model, "final", ())

    def new_state(self) -> None:
        return None

    def propose(self, committed, pending_states, state, gamma, temperature, generator):
        drafter = self.drafter
        logits = drafter.heads(pending_states[-1:].to(self._dtype)[None])[0, 0].float()  # [K, Dv]
        logits = logits[: min(gamma, logits.shape[0])]
        if temperature <= 0:
            indices = logits.argmax(-1)
            return drafter.to_target_ids(indices).tolist(), []
        q = torch.softmax(logits / temperature, dim=-1)
        indices = torch.multinomial(q, 1, generator=generator)[:, 0]
        draft_ids, vocab = drafter.draft_token_ids, drafter.config.vocab_size
        return drafter.to_target_ids(indices).tolist(), [full_distribution(row, draft_ids, vocab) for row in q]


# ---- n-gram prompt lookup (no model) ---------------------------------------------------------------------
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


# ---- an independent small causal LM ------------------------------------------------------------------------
class DraftModelProposer:
    """Drafts with a DraftModelDrafter on its own KV cache, reading only tokens (vLLM's `draft_model`).

    The cache is caught up on the committed tokens it lacks in one pass; proposals are fed back one by
    one and cropped off afterwards, so the cache always holds committed tokens only.
    """

    method = DRAFT_MODEL.name
    target_states = "none"
    aux_layer_ids: tuple[int, ...] = ()

    def __init__(self, drafter: Any):
        self.drafter = drafter.eval()

    def check_target(self, target_model: Any) -> None:
        check_vocabulary(self.drafter, target_model)

    def new_state(self) -> Any:
        return self.drafter.new_cache()

    def propose(self, committed, pending_states, state, gamma, temperature, generator):
        from draftsync.speculative.data.hidden_states import crop_kv_cache

        drafter, cache = self.drafter, state
        held = cache.get_seq_length()
        logits = drafter(torch.tensor([committed[held:]]), cache)
        proposals: list[int] = []
        distributions: list[torch.Tensor] = []
        for j in range(gamma):
            token, q = pick(logits[0, -1], temperature, generator)
            if q is not None:
                distributions.append(q)
            proposals.append(token)
            if j + 1 < gamma:
                logits = drafter(torch.tensor([[token]]), cache)
        crop_kv_cache(cache, cache.get_seq_length() - len(committed))
        return proposals, distributions


# ---- factory ---------------------------------------------------------------------------------------------
def make_proposer(drafter_or_name: Any, **options: Any) -> Proposer:
    """A proposer for a drafter object (by its `method`), for the name "ngram" (options: prompt_lookup_min,
    prompt_lookup_max), or the proposer itself when one is given."""
    if isinstance(drafter_or_name, str):
        if drafter_or_name == NGRAM.name:
            return NgramProposer(**options)
        raise DraftsyncError(
            f"no proposer is named {drafter_or_name!r}",
            "name 'ngram', or pass a drafter object (load it with load_drafter)",
        )
    if options:  # a drafter's proposer takes the drafter alone: say so rather than fail with a TypeError
        raise DraftsyncError(
            f"proposer options {sorted(options)} apply to 'ngram' only", "pass a drafter object without options"
        )
    if hasattr(drafter_or_name, "propose") and hasattr(drafter_or_name, "new_state"):
        return drafter_or_name
    method = drafter_method(drafter_or_name)
    if method in CHAIN_METHODS:
        return ChainProposer(drafter_or_name)
    if method == MEDUSA.name:
        return MedusaProposer(drafter_or_name)
    if method == DRAFT_MODEL.name:
        return DraftModelProposer(drafter_or_name)
    raise DraftsyncError(
        f"drafter method {method!r} has no proposer",
        f"use one of {', '.join(CHAIN_METHODS + (MEDUSA.name, DRAFT_MODEL.name, NGRAM.name))}",
    )
