"""The block proposer: a DFlash drafter drafts every position of a proposal in one pass."""

from __future__ import annotations

from typing import Any

import torch

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods.proposing import check_target_states, pick


class BlockProposer:
    """Feeds the verified positions' aux states into the drafter's context, then drafts a block after the last
    committed token. Rows are drawn independently (argmax at T=0), as vLLM samples a parallel draft."""

    target_states = "aux"

    def __init__(self, drafter: Any):
        self.drafter = drafter.eval()
        self.method = drafter.method
        self.aux_layer_ids = tuple(drafter.aux_layer_ids)
        self._dtype = next(drafter.parameters()).dtype

    def check_target(self, target_model: Any) -> None:
        check_target_states(self.drafter, target_model, self.target_states, self.aux_layer_ids)

    def new_state(self) -> Any:
        return self.drafter.new_context()

    def propose(self, committed, pending_states, state, gamma, temperature, generator):
        limit = self.drafter.config.max_draft_tokens
        if gamma > limit:
            raise DraftsyncError(
                f"gamma {gamma} was asked of a DFlash drafter whose blocks draft at most {limit} tokens",
                f"draft at most {limit} tokens a step, or train with a larger block_size",
            )
        verified = len(committed) - 1
        if state.length + pending_states.shape[0] != verified:
            raise DraftsyncError(
                f"the drafter's context holds {state.length} positions and {pending_states.shape[0]} arrived, "
                f"but the target verified {verified}",
                "hand the proposer the states of every verified position, once",
            )
        with torch.no_grad():
            logits = self.drafter.draft(pending_states.to(self._dtype), state, committed[-1], gamma)
        proposals: list[int] = []
        distributions: list[torch.Tensor] = []
        for row in logits:
            index, q = pick(row.float(), temperature, generator)
            proposals.append(index)
            if q is not None:
                distributions.append(q)
        return proposals, distributions
