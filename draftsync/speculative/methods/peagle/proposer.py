"""The parallel proposer: a P-EAGLE drafter drafts every position of a proposal in one pass after the verified ones."""

from __future__ import annotations

import torch

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods.eagle3.proposer import ChainProposer
from draftsync.speculative.methods.proposing import full_distribution, pick


class ParallelProposer(ChainProposer):
    """Catches the drafter's KV cache up on the verified positions as a chain does, then drafts gamma - 1 masked rows
    behind them in the same call (model.py `draft`); each row is drawn on its own, as vLLM samples a parallel draft."""

    def propose(self, committed, pending_states, state, gamma, temperature, generator):
        drafter, cache = self.drafter, state
        limit = drafter.config.max_draft_tokens
        if gamma > limit:
            raise DraftsyncError(
                f"gamma {gamma} was asked of a P-EAGLE drafter trained to draft {limit} tokens",
                f"draft at most {limit} tokens a step, or train with a larger max_draft_tokens",
            )
        verified = len(committed) - 1  # positions the target has run; committed[-1] is not run yet
        start = cache.length
        ids = torch.tensor(committed[start + 1 : verified + 1])
        with torch.no_grad():
            logits = drafter.draft(ids, pending_states.to(self._dtype), start, gamma, cache)
        proposals: list[int] = []
        distributions: list[torch.Tensor] = []
        for row in logits:
            index, q = pick(row.float(), temperature, generator)
            if q is not None:
                distributions.append(full_distribution(q, drafter.draft_token_ids, drafter.config.vocab_size))
            proposals.append(int(drafter.to_target_ids(torch.tensor(index))))
        return proposals, distributions
