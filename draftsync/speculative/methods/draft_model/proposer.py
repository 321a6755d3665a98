"""The draft model's proposer: an independent small causal LM drafts on its own KV cache, reading only tokens."""

from __future__ import annotations

from typing import Any

import torch

from draftsync.speculative.methods import DRAFT_MODEL
from draftsync.speculative.methods.proposing import check_vocabulary, pick


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
