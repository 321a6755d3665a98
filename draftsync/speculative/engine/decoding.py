"""Reference speculative decoding: a proposer drafts, the target verifies in one forward pass.

Lossless by construction: at T=0 a draft token is accepted only if it is the target's greedy token; at
T>0 it is accepted with probability min(1, p/q) and a rejection resamples from the normalised residual
max(0, p - q), so the output follows the target's own distribution. At T>0 the drafts are verified either of
vLLM's two ways (its `draft_sample_method`): "probabilistic" samples each draft from the drafter's q; "greedy"
(vLLM's default) drafts the drafter's argmax and verifies it as a one-hot q: kept with probability p(x), a
rejection resampling from p with x removed. Both are lossless; they differ in how much is accepted, which
validation measures (docs/VALIDATION.md). When every draft is accepted the
target's distribution after the last one gives a bonus token. The target's KV cache is cropped back to
the accepted prefix. Counters follow vLLM's spec-decode metrics (drafts, draft tokens, accepted, per
position); a step whose proposal is empty (n-gram lookup without a match) is no draft, as in vLLM.

Drafting is the proposer's, which each method brings (methods/<method>/proposer.py: EAGLE-3/3.1/1 chains, Medusa
heads, n-gram lookup, an independent draft model) and the method registry hands out; the engine captures only the
target states it reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError

if TYPE_CHECKING:
    import torch

    from draftsync.speculative.methods.proposing import Proposer


@dataclass
class RequestStats:
    """Per-request speculation counters, as vLLM counts them."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0


@dataclass
class Generation:
    token_ids: list[int]  # the generated tokens only, prompt excluded
    stats: RequestStats
    seconds: float
    first_token_seconds: float = 0.0  # time to the first token (the prefill), part of `seconds`


DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")  # vLLM's draft_sample_method values, its default first


def verify_proposals(
    proposals: list[int],
    draft_distributions: list[torch.Tensor] | None,
    target_logits: torch.Tensor,
    temperature: float,
    generator: torch.Generator,
) -> tuple[int, int]:
    """(number of proposals accepted, the token that follows them), checked against the target.

    `target_logits` [len(proposals)+1, V] are the target's logits before each proposal and after the last.
    T=0: a proposal stands if it is the target's greedy token, and the first mismatch is replaced by it.
    T>0: proposal x drawn from q is kept with probability min(1, p(x)/q(x)); the first rejection draws from
    max(0, p - q) normalised, so every emitted token follows p exactly. All kept: a bonus token from p.
    `draft_distributions` (T>0 only) are each proposal's q over the target vocabulary; None: each proposal is the
    drafter's argmax (vLLM's greedy draft sampling), a one-hot q, so it is kept with probability p(x) and a
    rejection draws from p without x, as vLLM's rejection sampler does without draft probabilities.
    """
    import torch

    for i, token in enumerate(proposals):
        if temperature <= 0:
            greedy = int(target_logits[i].argmax())
            if greedy != token:
                return i, greedy
            continue
        p = torch.softmax(target_logits[i] / temperature, dim=-1)
        if draft_distributions is None:
            q = torch.zeros_like(p)
            q[token] = 1.0
        else:
            q = draft_distributions[i]
        if float(torch.rand((), generator=generator)) * float(q[token]) < float(p[token]):
            continue
        residual = (p - q).clamp_min(0)
        total = float(residual.sum())
        residual = residual / total if total > 0 else p
        return i, int(torch.multinomial(residual, 1, generator=generator))
    return len(proposals), sample_token(target_logits[len(proposals)], temperature, generator)


def sample_token(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> int:
    """Greedy at T=0, else a draw from softmax(logits / T)."""
    import torch

    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


class SpeculativeEngine:
    """Generates with `target_model`, speculating `gamma` tokens per step when `drafter` is given.

    `drafter`: any drafter object of the shared interface (Eagle3Drafter, EagleDrafter, MedusaDrafter,
    DraftModelDrafter), the name "ngram", or a proposer (methods/proposing.py); None or gamma 0 turns speculation off.
    `draft_sampling` is how drafts are made and verified at T>0 (`DRAFT_SAMPLE_METHODS`; see `verify_proposals`).
    """

    def __init__(self, target_model: Any, drafter: Any, gamma: int, draft_sampling: str = "probabilistic"):
        from draftsync.speculative.data.hidden_states import cache_keyword, num_decoder_layers
        from draftsync.speculative.methods.registry import make_proposer

        if gamma < 0:
            raise DraftsyncError(f"gamma={gamma} is negative", "use gamma >= 0 (0 turns speculation off)")
        if draft_sampling not in DRAFT_SAMPLE_METHODS:
            raise DraftsyncError(
                f"draft sampling {draft_sampling!r} is unknown", f"use one of {', '.join(DRAFT_SAMPLE_METHODS)}"
            )
        self.draft_sampling = draft_sampling
        self.target = target_model.eval()
        self.proposer: Proposer | None = make_proposer(drafter) if drafter is not None and gamma > 0 else None
        if self.proposer is not None:
            self.proposer.check_target(target_model)
        self.drafter = drafter if self.proposer is not None else None
        self.gamma = gamma if self.proposer is not None else 0
        self.target_states = self.proposer.target_states if self.proposer is not None else "none"
        if self.proposer is not None and self.target_states == "aux":
            self.layer_ids = tuple(self.proposer.aux_layer_ids)
        else:
            self.layer_ids = (num_decoder_layers(target_model),)
        self._cache_keyword = cache_keyword(target_model)

    # ---- the target's pass ------------------------------------------------------------------------
    def _target_step(self, ids: list[int], cache: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [n, V] of `ids`, run after what `cache` holds, and the states [n, D] the proposer reads."""
        import torch

        from draftsync.speculative.data.hidden_states import capture

        input_ids = torch.tensor([ids])
        if self.target_states == "none":
            out = self.target(input_ids=input_ids, use_cache=True, **{self._cache_keyword: cache})
            return out.logits[0].float(), None
        states = capture(self.target, input_ids, self.layer_ids, cache=cache)
        return states.logits[0].float(), (states.aux[0] if self.target_states == "aux" else states.final[0])

    def _propose(
        self,
        proposer: Proposer,
        committed: list[int],
        pending: Any,
        state: Any,
        gamma: int,
        temperature: float,
        generator: torch.Generator,
    ) -> tuple[list[int], list[torch.Tensor] | None]:
        """The proposals and their q; greedy draft sampling asks the proposer for its argmax (None: one-hot q)."""
        if self.draft_sampling == "greedy" and temperature > 0:
            proposals, _ = proposer.propose(committed, pending, state, gamma, 0.0, generator)
            return proposals, None
        return proposer.propose(committed, pending, state, gamma, temperature, generator)

    # ---- generation -------------------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        eos_token_id: int | None = None,
    ) -> Generation:
        import torch

        from draftsync.speculative.data.hidden_states import crop_kv_cache, new_kv_cache

        vocab = self.target.config.vocab_size
        if not prompt_ids or min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise DraftsyncError(
                f"the prompt is empty or has ids outside the vocabulary (0..{vocab - 1})",
                "tokenize the prompt with the target's tokenizer",
            )
        started = time.perf_counter()
        generator = torch.Generator()
        generator.manual_seed(seed if seed is not None else int(torch.seed()) % (2**63))
        stats = RequestStats(accepted_per_position=[0] * self.gamma)
        out: list[int] = []
        if max_new_tokens <= 0:
            return Generation(out, stats, time.perf_counter() - started)

        proposer = self.proposer
        with torch.no_grad():
            target_cache = new_kv_cache(self.target)
            state = proposer.new_state() if proposer is not None else None
            committed = list(prompt_ids)
            logits, pending = self._target_step(committed, target_cache)  # states the proposer has not seen
            new_tokens = [sample_token(logits[-1], temperature, generator)]
            first_token_seconds = time.perf_counter() - started
            while True:
                for token in new_tokens:
                    out.append(token)
                    committed.append(token)
                    if token == eos_token_id or len(out) >= max_new_tokens:
                        return Generation(out, stats, time.perf_counter() - started, first_token_seconds)
                gamma = min(self.gamma, max_new_tokens - len(out) - 1)
                proposals: list[int] = []
                if proposer is not None and gamma > 0:  # self.gamma is 0 without a proposer
                    proposals, distributions = self._propose(
                        proposer, committed, pending, state, gamma, temperature, generator
                    )
                    pending = None  # the proposer has consumed them
                if not proposals:  # nothing to verify: one plain decoding step
                    logits, states = self._target_step(committed[-1:], target_cache)
                    if states is not None:
                        pending = states if pending is None else torch.cat([pending, states])
                    new_tokens = [sample_token(logits[-1], temperature, generator)]
                    continue
                logits, states = self._target_step(committed[-1:] + proposals, target_cache)
                accepted, follow = verify_proposals(proposals, distributions, logits, temperature, generator)
                crop_kv_cache(target_cache, len(proposals) - accepted)
                pending = None if states is None else states[: accepted + 1]
                stats.drafts += 1
                stats.draft_tokens += len(proposals)
                stats.accepted += accepted
                for position in range(accepted):
                    stats.accepted_per_position[position] += 1
                new_tokens = proposals[:accepted] + [follow]
