"""The chain proposer: EAGLE-3, EAGLE 3.1 and EAGLE-1 draft one token at a time, on the drafter's own KV cache."""

from __future__ import annotations

from typing import Any

import torch

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods.proposing import check_target_states, full_distribution, pick


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
        self.method = drafter.method
        states = drafter.target_states
        if states not in ("aux", "final"):
            raise DraftsyncError(
                f"a chain drafter reading target states {states!r} cannot be drafted from",
                "give an EAGLE-style drafter (target_states 'aux' or 'final')",
            )
        self.target_states = states
        self.aux_layer_ids = tuple(drafter.aux_layer_ids) if states == "aux" else ()
        self._dtype = next(drafter.parameters()).dtype

    def check_target(self, target_model: Any) -> None:
        check_target_states(self.drafter, target_model, self.target_states, self.aux_layer_ids)

    def new_state(self) -> Any:
        return self.drafter.new_cache()

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
