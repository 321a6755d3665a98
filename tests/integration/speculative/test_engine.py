"""The reference speculative-decoding engine: exact at T=0, distribution-preserving at T>0, honest counters."""

from __future__ import annotations

import itertools

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.engine.decoding import SpeculativeEngine, verify_proposals
from draftsync.speculative.methods.eagle3.model import Eagle3Config, Eagle3Drafter

from tests.support.greedy import greedy_reference

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def prompts(make_chains):
    chains = make_chains(3, 6, seed=99)
    return chains + [[7, 300, 3, 41]]  # the last one leaves the chains (ids the drafters rarely saw)


@pytest.fixture(scope="module")
def greedy(target, prompts):
    return [greedy_reference(target, prompt, NEW_TOKENS) for prompt in prompts]


def assert_consistent(stats, gamma):
    assert len(stats.accepted_per_position) == gamma
    assert 0 <= stats.accepted <= stats.draft_tokens <= gamma * stats.drafts
    assert sum(stats.accepted_per_position) == stats.accepted
    per_position = stats.accepted_per_position
    assert all(a >= b for a, b in itertools.pairwise(per_position))
    assert per_position[0] <= stats.drafts if gamma else True
    if stats.drafts:
        assert stats.acceptance_rate == stats.accepted / stats.draft_tokens
        assert stats.mean_acceptance_length == 1 + stats.accepted / stats.drafts


@pytest.mark.parametrize("gamma", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("which", ["random_drafter", "trained_drafter"])
def test_greedy_speculation_returns_exactly_the_target_greedy_tokens(request, target, prompts, greedy, gamma, which):
    engine = SpeculativeEngine(target, request.getfixturevalue(which), gamma)
    for prompt, expected in zip(prompts, greedy, strict=True):
        generation = engine.generate(prompt, NEW_TOKENS)
        assert generation.token_ids == expected
        assert_consistent(generation.stats, gamma)


@pytest.mark.parametrize("drafter, gamma", [(None, 3), ("trained_drafter", 0)])
def test_without_speculation_decoding_is_plain(request, target, prompts, greedy, drafter, gamma):
    engine = SpeculativeEngine(target, request.getfixturevalue(drafter) if drafter else None, gamma)
    generation = engine.generate(prompts[0], NEW_TOKENS)
    assert generation.token_ids == greedy[0]
    assert generation.stats.drafts == 0 and generation.stats.accepted_per_position == []


def test_trained_drafter_is_accepted_far_more_than_a_random_one(target, prompts, random_drafter, trained_drafter):
    def acceptance(drafter):
        engine = SpeculativeEngine(target, drafter, 3)
        stats = [engine.generate(prompt, NEW_TOKENS).stats for prompt in prompts[:3]]
        return sum(s.accepted for s in stats) / sum(s.draft_tokens for s in stats)

    trained, random = acceptance(trained_drafter), acceptance(random_drafter)
    assert trained > 0.6 and random < 0.1


def test_counters_stay_consistent_when_sampling(target, prompts, trained_drafter):
    engine = SpeculativeEngine(target, trained_drafter, 4)
    for seed in range(5):
        generation = engine.generate(prompts[seed % len(prompts)], 30, temperature=1.0, seed=seed)
        assert len(generation.token_ids) == 30
        assert_consistent(generation.stats, 4)
        assert generation.stats.accepted > 0


def test_a_seed_reproduces_a_sampled_generation(target, prompts, trained_drafter):
    engine = SpeculativeEngine(target, trained_drafter, 3)
    first = engine.generate(prompts[0], 20, temperature=0.8, seed=11)
    assert engine.generate(prompts[0], 20, temperature=0.8, seed=11).token_ids == first.token_ids
    assert any(
        engine.generate(prompts[0], 20, temperature=0.8, seed=s).token_ids != first.token_ids for s in range(12, 16)
    )


def test_generation_stops_after_eos(target, prompts, greedy):
    eos = greedy[0][5]
    generation = SpeculativeEngine(target, None, 0).generate(prompts[0], NEW_TOKENS, eos_token_id=eos)
    assert generation.token_ids == greedy[0][: greedy[0].index(eos) + 1]


# ---- losslessness at T > 0 -------------------------------------------------------------------------
def total_variation(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


def test_rejection_sampling_reproduces_the_target_distribution():
    """verify_proposals with a draft distribution q far from p: the emitted token must still follow p."""
    p_logits = torch.log(torch.tensor([0.45, 0.25, 0.15, 0.10, 0.05, 0.0001]))
    q = torch.tensor([0.05, 0.10, 0.05, 0.20, 0.40, 0.20])
    p = torch.softmax(p_logits, -1)
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(6)
    accepted = 0
    trials = 20000
    for _ in range(trials):
        proposal = int(torch.multinomial(q, 1, generator=generator))
        kept, token = verify_proposals([proposal], [q], torch.stack([p_logits, p_logits]), 1.0, generator)
        counts[proposal if kept else token] += 1
        accepted += kept
    assert total_variation(counts, p) < 0.015
    assert abs(accepted / trials - float(torch.minimum(p, q).sum())) < 0.015
    # the test has power: resampling from p itself on rejection, or keeping every proposal, is far off
    beta = torch.minimum(p, q)
    assert 0.5 * float((beta + (1 - beta.sum()) * p - p).abs().sum()) > 0.1
    assert 0.5 * float((q - p).abs().sum()) > 0.1


def test_all_accepted_proposals_earn_a_bonus_token_from_the_target():
    logits = torch.tensor([[0.0, 9.0, 0.0], [0.0, 0.0, 9.0], [9.0, 0.0, 0.0]])
    assert verify_proposals([1, 2], [], logits, 0.0, torch.Generator()) == (2, 0)
    assert verify_proposals([1, 0], [], logits, 0.0, torch.Generator()) == (1, 2)


def exact_second_token_distribution(target, prompt, temperature):
    """P(second generated token) = sum over first tokens t of p(t | prompt) p(. | prompt, t)."""
    vocab = target.config.vocab_size
    with torch.no_grad():
        first = torch.softmax(target(input_ids=torch.tensor([prompt])).logits[0, -1] / temperature, -1)
        batch = torch.cat([torch.tensor([prompt]).expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)
        second = torch.softmax(target(input_ids=batch).logits[:, -1] / temperature, -1)
    return first @ second


@pytest.mark.parametrize("which", ["random_drafter", "trained_drafter"])
def test_sampled_speculation_follows_the_target_distribution(request, target, prompts, which):
    """Over 300 seeds the second token (the first one speculated) has the target's exact distribution."""
    temperature = 1.5
    prompt = prompts[0]
    probs = exact_second_token_distribution(target, prompt, temperature)
    engine = SpeculativeEngine(target, request.getfixturevalue(which), 2)
    counts = torch.zeros_like(probs)
    for seed in range(300):
        generation = engine.generate(prompt, 4, temperature=temperature, seed=seed)
        assert generation.stats.drafts >= 1  # the second token went through draft-and-verify
        counts[generation.token_ids[1]] += 1
    # bins: the 6 likeliest tokens and the rest together (rejection errors show in the tail first)
    top = probs.argsort(descending=True)[:6]
    binned_probs = torch.cat([probs[top], (1 - probs[top].sum()).reshape(1)])
    binned_counts = torch.cat([counts[top], (counts.sum() - counts[top].sum()).reshape(1)])
    expected = binned_probs * 300
    chi_square = float(((binned_counts - expected) ** 2 / expected).sum())
    assert chi_square < 22.5  # 6 degrees of freedom, p = 0.001


# ---- both of vLLM's draft sampling methods are lossless at T=1 ---------------------------------------------------
FIRST_TOKENS = 3  # the first is the prefill's; with gamma 2 the next two are drafted and verified
LOSSLESS_SAMPLES = 400  # generations per arm, each its own seed
SIGNIFICANCE = 0.001  # of each homogeneity test (seeded: the verdict is the same on every run)


def first_tokens(engine, prompt, seeds) -> list[tuple[int, ...]]:
    return [
        tuple(engine.generate(prompt, FIRST_TOKENS + 1, temperature=1.0, seed=s).token_ids[:FIRST_TOKENS])
        for s in seeds
    ]


TAIL_GROUPS = 4  # the rarer tokens of a position, grouped by id


def homogeneity(first: list[tuple], second: list[tuple]) -> tuple[float, float, int]:
    """(chi-square statistic, its critical value at SIGNIFICANCE, degrees of freedom) of the test that two samples of
    token tuples come from one distribution. Each position's token is kept where it is frequent at that position
    (10 or more in both samples together), else replaced by its id's group (TAIL_GROUPS): the tiny target's tail is
    flat, and a verifier's error shows in how the likely token and the rest share the mass. The tuples seen 10 or
    more times are bins, the rest one bin, so every expected count is 5 or more under the null; the bins depend on
    the pooled counts alone."""
    from collections import Counter

    from scipy.stats import chi2

    both = first + second
    frequent = [{tok for tok, n in Counter(t[i] for t in both).items() if n >= 10} for i in range(len(both[0]))]

    def category(sample):
        return [
            tuple(tok if tok in frequent[i] else f"group {tok % TAIL_GROUPS}" for i, tok in enumerate(t))
            for t in sample
        ]

    first, second = category(first), category(second)
    pooled = Counter(first + second)
    bins = [t for t, n in pooled.items() if n >= 10]

    def binned(sample):
        counts = Counter(t if t in bins else None for t in sample)
        return torch.tensor([counts[t] for t in bins] + [counts[None]], dtype=torch.float64)

    observed = torch.stack([binned(first), binned(second)])
    observed = observed[:, observed.sum(0) > 0]
    expected = observed.sum(1, keepdim=True) * observed.sum(0, keepdim=True) / observed.sum()
    statistic = float(((observed - expected) ** 2 / expected).sum())
    df = observed.shape[1] - 1
    return statistic, float(chi2.ppf(1 - SIGNIFICANCE, df)), df


def resample_from_p_on_rejection(proposals, draft_distributions, target_logits, temperature, generator):
    """A plausible bug for the test to catch: greedy drafts kept with probability p(x), but a rejection redraws from
    all of p (x included), so x comes out more often than p says."""
    p = torch.softmax(target_logits / temperature, dim=-1)
    for i, token in enumerate(proposals):
        if float(torch.rand((), generator=generator)) >= float(p[i, token]):
            return i, int(torch.multinomial(p[i], 1, generator=generator))
    return len(proposals), int(torch.multinomial(p[len(proposals)], 1, generator=generator))


def test_both_draft_sampling_methods_keep_the_targets_distribution_at_t1(target, prompts, trained_drafter, monkeypatch):
    """The first tokens of 400 seeded generations per arm, speculating at gamma 2 with greedy drafts (vLLM's default)
    and with sampled ones, follow plain sampling's distribution: a chi-square homogeneity test against plain
    sampling's own 400 does not reject at p = 0.001; the same test rejects a verifier with a wrong residual."""
    import draftsync.speculative.engine.decoding as decoding

    prompt, n = prompts[0], LOSSLESS_SAMPLES
    plain = first_tokens(SpeculativeEngine(target, None, 0), prompt, range(n))
    arms = {
        sampling: first_tokens(SpeculativeEngine(target, trained_drafter, 2, sampling), prompt, range(n * k, n * k + n))
        for k, sampling in enumerate(("greedy", "probabilistic"), start=1)
    }
    for sampling, sample in arms.items():
        statistic, critical, df = homogeneity(sample, plain)
        assert statistic < critical, f"{sampling}: chi-square {statistic:.1f} >= {critical:.1f} ({df} df)"
    assert len({t[1:] for t in arms["greedy"]}) > 10  # the drafted positions were sampled, not all accepted drafts

    monkeypatch.setattr(decoding, "verify_proposals", resample_from_p_on_rejection)
    wrong = first_tokens(SpeculativeEngine(target, trained_drafter, 2, "greedy"), prompt, range(4 * n, 5 * n))
    statistic, critical, df = homogeneity(wrong, plain)
    assert statistic > critical, f"the test has no power: chi-square {statistic:.1f} < {critical:.1f} ({df} df)"


def test_greedy_draft_sampling_verifies_the_argmax_as_vllm_does():
    """No draft distribution: the draft is kept with probability p(x), and a rejection never redraws x."""
    p_logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    logits = torch.stack([p_logits, p_logits])
    generator = torch.Generator().manual_seed(0)
    outcomes = [verify_proposals([0], None, logits, 1.0, generator) for _ in range(4000)]
    kept = sum(k for k, _ in outcomes) / len(outcomes)
    assert abs(kept - 0.5) < 0.03
    redrawn = [t for k, t in outcomes if k == 0]
    assert 0 not in redrawn and abs(redrawn.count(1) / len(redrawn) - 0.6) < 0.04


def test_an_unknown_draft_sampling_is_refused(target, trained_drafter):
    with pytest.raises(DraftsyncError, match="draft sampling"):
        SpeculativeEngine(target, trained_drafter, 2, "typical")


# ---- bad input -------------------------------------------------------------------------------------
def test_a_drafter_for_another_vocabulary_is_refused(target):
    from transformers import LlamaConfig

    other = LlamaConfig(
        vocab_size=500,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=512,
    )
    drafter = Eagle3Drafter(Eagle3Config.for_target(other))
    with pytest.raises(DraftsyncError, match="vocabulary"):
        SpeculativeEngine(target, drafter, 3)
    with pytest.raises(DraftsyncError, match="gamma"):
        SpeculativeEngine(target, None, -1)
    with pytest.raises(DraftsyncError, match="prompt"):
        SpeculativeEngine(target, None, 0).generate([5000], 3)


# ---- short and empty proposals, and the states a proposer is handed ------------------------------------------
class ScriptedProposer:
    """Proposes a scripted number of the target's own greedy tokens, one of them spoiled where the script
    says, and checks that the engine hands it the final states of exactly the positions verified since its
    previous call. It keeps a log of what each proposal should count."""

    method = "scripted"
    target_states = "final"
    aux_layer_ids = ()

    def __init__(self, target, continuation, script):
        self.target, self.continuation, self.script = target, continuation, script
        self.log: list[tuple[int, int]] = []  # (proposed, expected accepted) per non-empty proposal

    def check_target(self, target_model):
        return None

    def new_state(self):
        return {"seen": 0, "calls": 0, "prompt": None}

    def propose(self, committed, pending_states, state, gamma, temperature, generator):
        from draftsync.speculative.data.hidden_states import capture

        verified = len(committed) - 1
        if state["prompt"] is None:
            state["prompt"] = verified
        layers = len(self.target.model.layers)
        expected = capture(self.target, torch.tensor([committed[:-1]]), (layers,)).final[0, state["seen"] :]
        assert pending_states.shape == expected.shape and torch.allclose(pending_states, expected, atol=1e-4)
        state["seen"] = verified
        length, spoiled = self.script[state["calls"] % len(self.script)]
        state["calls"] += 1
        generated = len(committed) - state["prompt"]
        proposals = list(self.continuation[generated : generated + min(length, gamma)])
        if spoiled is not None and spoiled < len(proposals):
            proposals[spoiled] = (proposals[spoiled] + 1) % self.target.config.vocab_size
        if proposals:
            accepted = len(proposals) if spoiled is None or spoiled >= len(proposals) else spoiled
            self.log.append((len(proposals), accepted))
        return proposals, []


@pytest.mark.parametrize("gamma", [1, 3, 4])
def test_short_and_empty_proposals_are_verified_and_counted_as_vllm_does(target, prompts, greedy, gamma):
    """An empty proposal is a plain decoding step and no draft; a short one counts its own length."""
    script = [(3, None), (0, None), (2, 0), (5, 2), (0, None), (0, None), (1, None), (4, 3)]
    proposer = ScriptedProposer(target, greedy[1], script)
    generation = SpeculativeEngine(target, proposer, gamma).generate(prompts[1], NEW_TOKENS)
    assert generation.token_ids == greedy[1]
    stats = generation.stats
    assert_consistent(stats, gamma)
    assert stats.drafts == len(proposer.log)
    assert stats.draft_tokens == sum(proposed for proposed, _ in proposer.log)
    assert stats.accepted == sum(accepted for _, accepted in proposer.log)
    assert stats.accepted_per_position == [sum(a > i for _, a in proposer.log) for i in range(gamma)]
