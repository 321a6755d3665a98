"""Every kind of drafter through the one engine: exact at T=0, the target's distribution at T>0, vLLM counters.

The drafters are untrained (random) on a target with a vocabulary of 8, so proposals are right often
enough, and wrong often enough, for accepted, rejected and bonus tokens to all occur.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.data.draft_vocab import build_draft_vocab
from draftsync.speculative.data.hidden_states import capture
from draftsync.speculative.engine.decoding import SpeculativeEngine
from draftsync.speculative.methods.draft_model.model import DraftModelDrafter
from draftsync.speculative.methods.eagle3.model import Eagle3Config, Eagle3Drafter
from draftsync.speculative.methods.ngram.proposer import NgramProposer, lookup
from draftsync.speculative.methods.registry import make_proposer

from tests.support.greedy import greedy_reference

SMALL_VOCAB = 8
NEW_TOKENS = 20
METHODS = ["eagle3", "eagle3.1", "eagle", "medusa", "ngram", "draft_model"]
SEEDS = {"eagle3": 13, "eagle3.1": 14, "eagle": 12}  # initial weights under which a fair share is accepted


def small_vocab_target(seed: int = 3):
    """A 4-layer Llama (hidden 32) over 8 tokens, with logits spread wide enough that greedy never ties."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=SMALL_VOCAB,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 0.25)
    return model


@pytest.fixture(scope="module")
def small_target():
    return small_vocab_target()


@pytest.fixture(scope="module")
def small_prompts():
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(SMALL_VOCAB, (length,), generator=generator).tolist() for length in (3, 6, 9, 12)]


@pytest.fixture(scope="module")
def small_greedy(small_target, small_prompts):
    return [greedy_reference(small_target, prompt, NEW_TOKENS) for prompt in small_prompts]


def build_drafter(method: str, target):
    """An untrained drafter of `method` for `target`, initialised from it where the method does (or the
    n-gram proposer)."""
    from draftsync.speculative.methods.registry import new_drafter

    torch.manual_seed(SEEDS.get(method, 11))
    if method == "ngram":
        return NgramProposer(prompt_lookup_min=1, prompt_lookup_max=3)
    if method == "draft_model":
        drafter = DraftModelDrafter.for_budget(target.config, 20_000)
    elif method in ("eagle3", "medusa"):  # a draft vocabulary of 6 of the 8 ids: q is zero on two of them
        drafter = new_drafter(method, target.config, draft_vocab_size=6)
        drafter.set_draft_vocab(*build_draft_vocab(torch.tensor([5, 1, 9, 7, 0, 3, 4, 8]), 6))
    else:
        drafter = new_drafter(method, target.config)
    if method not in ("eagle3", "eagle3.1"):  # EAGLE-3's copied head agrees with this target less than a random one
        drafter.initialise_from_target(target)
    return drafter.eval()


@pytest.fixture(scope="module")
def drafters(small_target):
    cache: dict[str, object] = {}

    def get(method: str):
        if method not in cache:
            cache[method] = build_drafter(method, small_target)
        return cache[method]

    return get


def assert_consistent(stats, gamma):
    """vLLM's counting: accepted <= draft tokens <= gamma per draft; accepted positions form a prefix."""
    assert len(stats.accepted_per_position) == gamma
    assert 0 <= stats.accepted <= stats.draft_tokens <= gamma * stats.drafts
    assert stats.drafts <= stats.draft_tokens  # an empty proposal is no draft
    per_position = stats.accepted_per_position
    assert sum(per_position) == stats.accepted
    assert all(a >= b for a, b in itertools.pairwise(per_position))
    assert not per_position or per_position[0] <= stats.drafts
    if stats.drafts:
        assert stats.acceptance_rate == stats.accepted / stats.draft_tokens
        assert stats.mean_acceptance_length == 1 + stats.accepted / stats.drafts


# ---- T = 0: exactly the target's greedy tokens ------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_greedy_speculation_returns_the_target_greedy_tokens(
    method, drafters, small_target, small_prompts, small_greedy
):
    drafter = drafters(method)
    totals = {"accepted": 0, "draft_tokens": 0}
    for gamma in (1, 3, 5):
        engine = SpeculativeEngine(small_target, drafter, gamma)
        for prompt, expected in zip(small_prompts, small_greedy, strict=True):
            generation = engine.generate(prompt, NEW_TOKENS)
            assert generation.token_ids == expected, (method, gamma, prompt)
            assert_consistent(generation.stats, gamma)
            totals["accepted"] += generation.stats.accepted
            totals["draft_tokens"] += generation.stats.draft_tokens
    # both paths were taken: some proposals accepted (bonus tokens, cache kept), some rejected (cache cropped)
    assert 0 < totals["accepted"] < totals["draft_tokens"], totals


def test_the_engine_captures_only_the_states_its_proposer_reads(drafters, small_target):
    assert SpeculativeEngine(small_target, drafters("eagle3"), 2).target_states == "aux"
    assert SpeculativeEngine(small_target, drafters("eagle3"), 2).layer_ids == (1, 2, 3)
    assert SpeculativeEngine(small_target, drafters("ngram"), 2).target_states == "none"
    assert SpeculativeEngine(small_target, drafters("draft_model"), 2).target_states == "none"
    assert SpeculativeEngine(small_target, None, 2).target_states == "none"
    proposer = make_proposer(drafters("eagle3.1"))
    assert SpeculativeEngine(small_target, proposer, 2).proposer is proposer  # a proposer object is taken as is
    assert proposer.method == "eagle3.1" and make_proposer(drafters("eagle3")).method == "eagle3"
    with pytest.raises(DraftsyncError, match="apply to 'ngram' only"):  # not a TypeError from deep inside
        make_proposer(drafters("medusa"), prompt_lookup_max=3)


# ---- T > 0: the output follows the target's distribution --------------------------------------------------
SAMPLES = 400
TEMPERATURE = 1.3
CHI_SQUARE_LIMIT = {
    dof: limit for dof, limit in [(1, 10.8), (2, 13.8), (3, 16.3), (4, 18.5), (5, 20.5), (6, 22.5), (7, 24.3)]
}  # p = 0.001


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic with bins of expected count < 5 pooled; (statistic, degrees of freedom)."""
    expected = probs * counts.sum()
    large = expected >= 5
    observed = torch.cat([counts[large], counts[~large].sum().reshape(1)])
    expected = torch.cat([expected[large], expected[~large].sum().reshape(1)])
    keep = expected > 0
    observed, expected = observed[keep], expected[keep]
    return float(((observed - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


def second_token_distributions(target, proposer, prompt):
    """P(second token) under the target, and under two broken samplers: one that keeps every proposal,
    and one that redraws a rejection from p instead of the residual max(0, p - q)."""
    vocab = target.config.vocab_size
    with torch.no_grad():
        first = torch.softmax(target(input_ids=torch.tensor([prompt])).logits[0, -1] / TEMPERATURE, -1)
    exact, keep_all, redraw_from_p = (torch.zeros(vocab) for _ in range(3))
    for token in range(vocab):
        committed = prompt + [token]
        with torch.no_grad():
            p = torch.softmax(target(input_ids=torch.tensor([committed])).logits[0, -1] / TEMPERATURE, -1)
        states = None
        if proposer.target_states != "none":
            layer_ids = proposer.aux_layer_ids if proposer.target_states == "aux" else (len(target.model.layers),)
            captured = capture(target, torch.tensor([prompt]), layer_ids)
            states = (captured.aux if proposer.target_states == "aux" else captured.final)[0]
        with torch.no_grad():
            proposals, q = proposer.propose(
                committed, states, proposer.new_state(), 1, TEMPERATURE, torch.Generator().manual_seed(0)
            )
        exact += first[token] * p
        if not proposals:  # no proposal: the target samples alone, broken or not
            keep_all += first[token] * p
            redraw_from_p += first[token] * p
            continue
        beta = torch.minimum(p, q[0])
        keep_all += first[token] * q[0]
        redraw_from_p += first[token] * (beta + (1 - beta.sum()) * p)
    return exact, keep_all, redraw_from_p


@pytest.mark.parametrize("method", METHODS)
def test_sampled_speculation_follows_the_target_distribution(method, drafters, small_target, small_prompts):
    """400 seeded generations: the second token (the first one speculated, gamma 2) has the target's
    distribution (chi-square, p = 0.001), and the same counts reject both broken samplers."""
    drafter = drafters(method)
    prompt = small_prompts[1]
    engine = SpeculativeEngine(small_target, drafter, 2)
    exact, keep_all, redraw_from_p = second_token_distributions(small_target, engine.proposer, prompt)
    counts = torch.zeros(SMALL_VOCAB)
    drafted = 0
    for seed in range(SAMPLES):
        generation = engine.generate(prompt, 4, temperature=TEMPERATURE, seed=seed)
        assert_consistent(generation.stats, 2)
        drafted += generation.stats.drafts > 0
        counts[generation.token_ids[1]] += 1
    assert drafted > SAMPLES // 2  # the second token went through draft-and-verify in most runs
    statistic, dof = chi_square(counts, exact)
    assert statistic < CHI_SQUARE_LIMIT[dof], (statistic, dof)
    for broken in (keep_all, redraw_from_p):  # the test has power against both
        statistic, dof = chi_square(counts, broken)
        assert statistic > CHI_SQUARE_LIMIT[dof], (statistic, dof)


def test_a_seed_reproduces_a_sampled_generation_for_every_kind(drafters, small_target, small_prompts):
    for method in ("eagle3", "ngram", "draft_model"):
        engine = SpeculativeEngine(small_target, drafters(method), 3)
        first = engine.generate(small_prompts[2], 15, temperature=1.0, seed=5).token_ids
        assert engine.generate(small_prompts[2], 15, temperature=1.0, seed=5).token_ids == first


# ---- n-gram lookup: vLLM's prompt lookup ------------------------------------------------------------------
def brute_force_lookup(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The longest n in [min_n, max_n] whose suffix occurs earlier (ending before the last token), earliest."""
    total = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if n >= total:
            continue
        suffix = tokens[total - n :]
        for start in range(total - n):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


def test_ngram_lookup_follows_vllms_example_and_rules():
    tokens = np.array([1, 2, 3, 4, 2, 3])
    assert lookup(tokens, 2, 3, 4) == [4, 2, 3]  # [4,2,3] unmatched; [2,3] matched; only 3 tokens follow
    assert lookup(tokens, 3, 3, 4) == []  # no match at min_n: no proposal
    assert lookup(np.array([5, 6, 7, 5, 6, 8, 5, 6]), 1, 2, 2) == [7, 5]  # earliest occurrence wins
    assert lookup(np.array([9, 1, 2, 4, 0, 2, 3, 1, 2]), 1, 3, 1) == [4]  # longest match beats a later one
    assert lookup(np.array([3, 3, 3, 3]), 1, 2, 5) == [3, 3]  # a match may overlap the suffix
    assert lookup(np.array([1, 2]), 2, 2, 3) == [] and lookup(np.array([1, 1]), 1, 1, 0) == []


def test_ngram_lookup_matches_a_brute_force_scan():
    generator = torch.Generator().manual_seed(3)
    for trial in range(300):
        length = int(torch.randint(1, 40, (), generator=generator))
        tokens = torch.randint(4, (length,), generator=generator).tolist()
        min_n = 1 + trial % 3
        max_n = min_n + trial % 4
        k = 1 + trial % 5
        assert lookup(np.array(tokens), min_n, max_n, k) == brute_force_lookup(tokens, min_n, max_n, k), tokens


def test_ngram_counts_no_draft_without_a_match_and_a_short_draft_by_its_length(target):
    """vLLM: an empty proposal schedules nothing and is not observed; a short one counts its own length."""
    distinct = list(range(0, 300, 7))[:20]  # no repeated 3-gram in the prompt; the target's outputs may add one
    plain = greedy_reference(target, distinct, 6)
    ngram = NgramProposer(prompt_lookup_min=3, prompt_lookup_max=3)
    generation = SpeculativeEngine(target, ngram, 4).generate(distinct, 6)
    assert generation.token_ids == plain
    if (
        len(set(zip(distinct + plain, (distinct + plain)[1:], (distinct + plain)[2:], strict=False)))
        == len(distinct + plain) - 2
    ):
        assert generation.stats.drafts == 0 and generation.stats.draft_tokens == 0
    # a repeated block: its suffix matches and proposes the block's continuation, cut short near the end
    block = greedy_reference(target, [11], 12)
    prompt = [11] + block + [11] + block[:2]
    expected = greedy_reference(target, prompt, 10)
    generation = SpeculativeEngine(target, ngram, 5).generate(prompt, 10)
    assert generation.token_ids == expected
    assert_consistent(generation.stats, 5)
    assert generation.stats.drafts > 0 and generation.stats.accepted > 0
    short = NgramProposer(prompt_lookup_min=2, prompt_lookup_max=2)
    proposals, _ = short.propose([4, 5, 6, 4, 5], None, short.new_state(), 5, 0.0, None)
    assert proposals == [6, 4, 5]  # three tokens follow the match, so three are proposed (and counted)


def test_ngram_options_are_checked():
    assert (NgramProposer().min_n, NgramProposer().max_n) == (5, 5)  # vLLM's defaults
    assert (NgramProposer(prompt_lookup_max=3).min_n, NgramProposer(prompt_lookup_min=2).max_n) == (3, 2)
    with pytest.raises(DraftsyncError, match="n-gram"):
        NgramProposer(prompt_lookup_min=4, prompt_lookup_max=2)
    with pytest.raises(DraftsyncError, match="n-gram"):
        NgramProposer(prompt_lookup_min=0, prompt_lookup_max=2)
    assert make_proposer("ngram", prompt_lookup_min=2, prompt_lookup_max=4).max_n == 4
    with pytest.raises(DraftsyncError, match="no proposer"):
        make_proposer("suffix")


# ---- draft model: aligned with the target, counted by position ---------------------------------------------
def test_a_draft_model_that_is_the_target_is_always_accepted(target, make_chains):
    """A copy of the target as draft model proposes exactly the target's greedy tokens: any off-by-one in
    the draft model's cache or positions would show as rejections."""
    copy = DraftModelDrafter.for_target(
        target.config,
        hidden_size=64,
        num_hidden_layers=4,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    copy.lm.load_state_dict(target.state_dict())
    prompt = make_chains(1, 6, seed=5)[0]
    generation = SpeculativeEngine(target, copy, 4).generate(prompt, 24)
    assert generation.token_ids == greedy_reference(target, prompt, 24)
    assert generation.stats.acceptance_rate == 1.0
    assert generation.stats.accepted_per_position[0] == generation.stats.drafts


def test_a_drafter_for_another_target_is_refused(small_target, target):
    for method in ("eagle3", "draft_model"):
        with pytest.raises(DraftsyncError, match="vocabulary"):
            SpeculativeEngine(target, build_drafter(method, small_target), 2)
    wide = Eagle3Drafter(Eagle3Config.for_target(target.config))
    wide.config.vocab_size = SMALL_VOCAB  # same vocabulary, other hidden size
    with pytest.raises(DraftsyncError, match="hidden size"):
        SpeculativeEngine(small_target, wide, 2)
    with pytest.raises(DraftsyncError, match="method"):
        make_proposer(torch.nn.Linear(2, 2))


# ---- the draft model itself: size, loss alignment, checkpoint -----------------------------------------------
def parameter_count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_a_draft_model_is_sized_to_the_budget_by_the_documented_rule(target):
    from draftsync.speculative.methods.draft_model.model import BUDGET_TOLERANCE, shape_for_budget
    from transformers import LlamaConfig

    budget = parameter_count(Eagle3Drafter(Eagle3Config.for_target(target.config)))
    drafter = DraftModelDrafter.for_budget(target.config, budget)
    shape = shape_for_budget(target.config, budget)
    assert parameter_count(drafter) == shape["parameters"]  # the count formula is exact
    assert drafter.config.vocab_size == drafter.config.draft_vocab_size == target.config.vocab_size
    assert drafter.config.target_hidden_size == target.config.hidden_size
    # a Llama-3-8B-like target: a budget of 300M lands within 5%, heads of the target's head dim, its grouping
    big = LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        tie_word_embeddings=False,
    )
    shape = shape_for_budget(big, 300_000_000)
    assert abs(shape["parameters"] - 300_000_000) <= BUDGET_TOLERANCE * 300_000_000
    assert shape["hidden_size"] == 128 * shape["num_attention_heads"]
    assert shape["num_attention_heads"] % shape["num_key_value_heads"] == 0
    assert 1 <= shape["num_hidden_layers"] <= 32
    with pytest.raises(DraftsyncError, match="draft vocabulary"):
        DraftModelDrafter.for_budget(target.config, budget, draft_vocab_size=256)
    with pytest.raises(DraftsyncError, match="budget"):
        shape_for_budget(target.config, 0)


def target_copy(target) -> DraftModelDrafter:
    copy = DraftModelDrafter.for_target(
        target.config,
        hidden_size=64,
        num_hidden_layers=4,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    copy.lm.load_state_dict(target.state_dict())
    return copy


def test_draft_model_loss_compares_row_t_with_the_target_distribution_at_t(target, make_chains):
    """A copy of the target agrees with it on every loss-masked row (row t vs target_logits[:, t], masked by
    loss_mask[:, t+1]) and its soft cross-entropy is the target's own entropy there."""
    from draftsync.speculative.data.training_batch import TrainingBatch

    ids = torch.tensor(make_chains(2, 16, seed=8))
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[1, 12:] = False
    loss_mask = valid.clone()
    loss_mask[:, :5] = False
    with torch.no_grad():
        logits = target(input_ids=ids).logits
    batch = TrainingBatch(
        ids=ids, valid=valid, loss_mask=loss_mask, aux=None, final=torch.zeros(2, 16, 64), target_logits=logits
    )
    loss = target_copy(target).training_loss(batch, ttt_steps=3, noise_std=0.1, generator=None)
    counted = int(loss_mask[:, 1:].sum())
    assert loss.position_counts == [counted] and loss.position_hits == [counted]
    probs = torch.softmax(logits[:, :-1][loss_mask[:, 1:]], -1)
    entropy = float(-(probs * torch.log(probs)).sum(-1).mean())
    assert loss.position_losses[0] == pytest.approx(entropy, rel=1e-4)
    shifted = TrainingBatch(
        ids=ids,
        valid=valid,
        loss_mask=loss_mask,
        aux=None,
        final=batch.final,
        target_logits=torch.roll(logits, 1, dims=1),
    )
    assert target_copy(target).training_loss(shifted, 1, 0.0, None).position_hits[0] < counted // 4
    with pytest.raises(DraftsyncError, match="target logits"):
        target_copy(target).training_loss(TrainingBatch(ids, valid, loss_mask, None, batch.final), 1, 0.0, None)


def test_draft_model_trains_its_body_and_keeps_copied_embeddings_frozen(target, make_chains):
    from draftsync.speculative.data.training_batch import TrainingBatch

    drafter = DraftModelDrafter.for_target(
        target.config,
        hidden_size=64,
        num_hidden_layers=1,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    drafter.initialise_from_target(target)
    assert torch.equal(drafter.lm.model.embed_tokens.weight, target.model.embed_tokens.weight)
    assert torch.equal(drafter.lm.lm_head.weight, target.lm_head.weight)
    assert not drafter.lm.model.embed_tokens.weight.requires_grad
    ids = torch.tensor(make_chains(2, 12, seed=9))
    with torch.no_grad():
        logits = target(input_ids=ids).logits
    ones = torch.ones_like(ids, dtype=torch.bool)
    loss = drafter.training_loss(TrainingBatch(ids, ones, ones, None, torch.zeros(2, 12, 64), logits), 1, 0.0, None)
    loss.total.backward()
    assert drafter.lm.model.layers[0].mlp.down_proj.weight.grad is not None
    narrow = DraftModelDrafter.for_budget(target.config, 20_000)
    before = narrow.lm.model.embed_tokens.weight.clone()
    narrow.initialise_from_target(target)  # other hidden size: nothing fits, nothing copied
    assert torch.equal(narrow.lm.model.embed_tokens.weight, before)
    with pytest.raises(DraftsyncError, match="whole vocabulary"):
        narrow.set_draft_vocab(torch.ones(256, dtype=torch.long), torch.ones(384, dtype=torch.bool))
    narrow.set_draft_vocab(None, None)


def test_draft_model_checkpoint_is_a_plain_hf_directory_with_a_marker(tmp_path, target):
    import json

    from draftsync.speculative.methods.checkpoint_files import SavedFor
    from draftsync.speculative.methods.draft_model.checkpoint import MARKER_FILE, load_draft_model, save_draft_model

    drafter = DraftModelDrafter.for_budget(target.config, 60_000)
    out = save_draft_model(drafter, tmp_path / "draft", SavedFor("targets/tiny", ("LlamaForCausalLM",), 3))
    config = json.loads((out / "config.json").read_text())
    marker = json.loads((out / MARKER_FILE).read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == target.config.vocab_size
    assert config["draftsync_drafter"] == "draft_model"
    assert marker["method"] == "draft_model" and marker["verifier_name_or_path"] == "targets/tiny"
    assert (out / "model.safetensors").is_file()
    loaded = load_draft_model(out)
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.equal(loaded(ids), drafter(ids))
    assert load_draft_model(out, dtype=torch.bfloat16).lm.lm_head.weight.dtype == torch.bfloat16
    (out / MARKER_FILE).unlink()
    with pytest.raises(DraftsyncError, match="not a draft_model checkpoint"):
        load_draft_model(out)
