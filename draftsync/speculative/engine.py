"""Reference speculative decoding: an EAGLE-3 drafter proposes, the target verifies in one forward pass.

Lossless by construction: at T=0 a draft token is accepted only if it is the target's greedy token; at
T>0 it is accepted with probability min(1, p/q) and a rejection resamples from the normalised residual
max(0, p - q), so the output follows the target's own distribution. When every draft is accepted the
target's distribution after the last one gives a bonus token. Both KV caches are cropped back to the
accepted prefix. Counters follow vLLM's spec-decode metrics (drafts, draft tokens, accepted, per position).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError

if TYPE_CHECKING:
    import torch

    from draftsync.speculative.eagle3 import Eagle3Drafter


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


def greedy_reference(target: Any, prompt_ids: list[int], n: int) -> list[int]:
    """Plain greedy decoding, a full forward pass per token and no cache: the ground truth for tests."""
    import torch

    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n):
            logits = target(input_ids=torch.tensor([ids])).logits
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt_ids) :]


def verify_proposals(proposals: list[int], draft_distributions: list["torch.Tensor"], target_logits: "torch.Tensor",
                     temperature: float, generator: "torch.Generator") -> tuple[int, int]:
    """(number of proposals accepted, the token that follows them), checked against the target.

    `target_logits` [len(proposals)+1, V] are the target's logits before each proposal and after the last.
    T=0: a proposal stands if it is the target's greedy token, and the first mismatch is replaced by it.
    T>0: proposal x drawn from q is kept with probability min(1, p(x)/q(x)); the first rejection draws from
    max(0, p - q) normalised, so every emitted token follows p exactly. All kept: a bonus token from p.
    `draft_distributions` (T>0 only) are each proposal's q over the target vocabulary.
    """
    import torch

    for i, token in enumerate(proposals):
        if temperature <= 0:
            greedy = int(target_logits[i].argmax())
            if greedy != token:
                return i, greedy
            continue
        p = torch.softmax(target_logits[i] / temperature, dim=-1)
        q = draft_distributions[i]
        if float(torch.rand((), generator=generator)) * float(q[token]) < float(p[token]):
            continue
        residual = (p - q).clamp_min(0)
        total = float(residual.sum())
        residual = residual / total if total > 0 else p
        return i, int(torch.multinomial(residual, 1, generator=generator))
    return len(proposals), sample_token(target_logits[len(proposals)], temperature, generator)


def sample_token(logits: "torch.Tensor", temperature: float, generator: "torch.Generator") -> int:
    """Greedy at T=0, else a draw from softmax(logits / T)."""
    import torch

    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


class SpeculativeEngine:
    """Generates with `target_model`, speculating with `drafter` (gamma tokens per step) when given."""

    def __init__(self, target_model: Any, drafter: "Eagle3Drafter | None", gamma: int):
        from draftsync.speculative.hidden_states import num_decoder_layers

        if gamma < 0:
            raise DraftsyncError(f"gamma={gamma} is negative", "use gamma >= 0 (0 turns speculation off)")
        self.target = target_model.eval()
        self.drafter = drafter.eval() if drafter is not None and gamma > 0 else None
        self.gamma = gamma if self.drafter is not None else 0
        layers = num_decoder_layers(target_model)
        if self.drafter is not None:
            config = self.drafter.config
            if config.vocab_size != target_model.config.vocab_size:
                raise DraftsyncError(
                    f"drafter vocabulary ({config.vocab_size}) differs from the target's "
                    f"({target_model.config.vocab_size})",
                    "serve the drafter trained for this target version, or speculation off",
                )
            if config.target_hidden_size != target_model.config.hidden_size or max(config.aux_layer_ids) > layers:
                raise DraftsyncError(
                    f"drafter expects a target with hidden size {config.target_hidden_size} and layers "
                    f"{list(config.aux_layer_ids)}; this target has {target_model.config.hidden_size} and {layers}",
                    "serve the drafter trained for this target version, or speculation off",
                )
            self.layer_ids = tuple(config.aux_layer_ids)
        else:
            self.layer_ids = (layers,)

    # ---- pieces -----------------------------------------------------------------------------------
    def _target_step(self, ids: list[int], cache: Any) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Logits [n, V] and aux states [n, 3H] of `ids`, run after what `cache` holds."""
        import torch

        from draftsync.speculative.hidden_states import capture

        states = capture(self.target, torch.tensor([ids]), self.layer_ids, cache=cache)
        return states.logits[0].float(), states.aux[0]

    def _draft(self, committed: list[int], pending_aux: "torch.Tensor", cache: Any, gamma: int,
               temperature: float, generator: "torch.Generator") -> tuple[list[int], list["torch.Tensor"]]:
        """Catch the drafter up on verified positions, then chain `gamma` proposals.

        Returns the proposed target ids and, at T>0, each proposal's distribution over the target vocabulary.
        """
        import torch

        drafter = self.drafter
        verified = len(committed) - 1  # positions the target has run; committed[-1] is not run yet
        start = cache.length
        ids = torch.tensor([committed[start + 1 : verified + 1]])
        hidden = drafter.fuse(pending_aux.to(drafter.lm_head.weight.dtype)[None])
        logits, hidden = drafter(ids, hidden, torch.arange(start, verified), cache)
        proposals: list[int] = []
        distributions: list[torch.Tensor] = []
        for j in range(gamma):
            step_logits = logits[0, -1].float()
            if temperature <= 0:
                draft_index = int(step_logits.argmax())
            else:
                q = torch.softmax(step_logits / temperature, dim=-1)
                draft_index = int(torch.multinomial(q, 1, generator=generator))
                full = torch.zeros(drafter.config.vocab_size)
                full[drafter.draft_token_ids] = q
                distributions.append(full)
            token = int(drafter.to_target_ids(torch.tensor(draft_index)))
            proposals.append(token)
            if j + 1 < gamma:
                position = torch.tensor([verified + j])
                logits, hidden = drafter(torch.tensor([[token]]), hidden[:, -1:], position, cache)
        cache.crop(verified)
        return proposals, distributions

    # ---- generation -------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                 seed: int | None = None, eos_token_id: int | None = None) -> Generation:
        import torch

        from draftsync.speculative.eagle3 import DrafterKVCache
        from draftsync.speculative.hidden_states import crop_kv_cache, new_kv_cache

        vocab = self.target.config.vocab_size
        if not prompt_ids or min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise DraftsyncError(f"the prompt is empty or has ids outside the vocabulary (0..{vocab - 1})",
                                 "tokenize the prompt with the target's tokenizer")
        started = time.perf_counter()
        generator = torch.Generator()
        generator.manual_seed(seed if seed is not None else int(torch.seed()) % (2**63))
        stats = RequestStats(accepted_per_position=[0] * self.gamma)
        out: list[int] = []
        if max_new_tokens <= 0:
            return Generation(out, stats, time.perf_counter() - started)

        with torch.no_grad():
            target_cache = new_kv_cache(self.target)
            draft_cache = DrafterKVCache()
            committed = list(prompt_ids)
            logits, pending_aux = self._target_step(committed, target_cache)
            new_tokens = [sample_token(logits[-1], temperature, generator)]
            while True:
                for token in new_tokens:
                    out.append(token)
                    committed.append(token)
                    if token == eos_token_id or len(out) >= max_new_tokens:
                        return Generation(out, stats, time.perf_counter() - started)
                gamma = min(self.gamma, max_new_tokens - len(out) - 1)
                if gamma <= 0:
                    logits, aux = self._target_step(committed[-1:], target_cache)
                    pending_aux = torch.cat([pending_aux, aux]) if self.drafter is not None else aux
                    new_tokens = [sample_token(logits[-1], temperature, generator)]
                    continue
                proposals, distributions = self._draft(committed, pending_aux, draft_cache, gamma, temperature,
                                                       generator)
                logits, aux = self._target_step(committed[-1:] + proposals, target_cache)
                accepted, follow = verify_proposals(proposals, distributions, logits, temperature, generator)
                crop_kv_cache(target_cache, gamma - accepted)
                pending_aux = aux[: accepted + 1]
                stats.drafts += 1
                stats.draft_tokens += gamma
                stats.accepted += accepted
                for position in range(accepted):
                    stats.accepted_per_position[position] += 1
                new_tokens = proposals[:accepted] + [follow]
