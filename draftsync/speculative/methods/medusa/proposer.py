"""The Medusa proposer: K heads read one state and propose K tokens at once."""

from __future__ import annotations

from typing import Any

import torch

from draftsync.speculative.methods import MEDUSA
from draftsync.speculative.methods.proposing import check_target_states, full_distribution


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
