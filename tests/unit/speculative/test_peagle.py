"""The P-EAGLE drafter: what training computes is what a parallel proposal drafts, its checkpoint as vLLM reads it, and
its refusals."""

from __future__ import annotations

import json

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.data.draft_vocab import build_draft_vocab
from draftsync.speculative.engine.decoding import SpeculativeEngine
from draftsync.speculative.methods.registry import drafter_method, load_drafter, new_drafter, save_drafter

from tests.support.greedy import greedy_reference

VOCAB = 384  # the tiny targets' vocabulary (conftest)


def peagle_for(target, seed=0, draft_vocab_size=200, **options):
    torch.manual_seed(seed)
    drafter = new_drafter("peagle", target.config, draft_vocab_size, aux_layer_ids=(1, 2, 3), **options)
    if draft_vocab_size:
        drafter.set_draft_vocab(*build_draft_vocab(torch.arange(VOCAB, 0, -1), draft_vocab_size))
    drafter.initialise_from_target(target)
    with torch.no_grad():  # a drafter that is not at its initial weights, so every tensor shows
        for parameter in drafter.parameters():
            if parameter.requires_grad:
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(seed + 1)))
    return drafter.eval()


@pytest.fixture(scope="module")
def chain_batch(target, make_chains, make_training_batch):
    ids = torch.tensor(make_chains(8, 40, seed=5))
    return make_training_batch(target, ids)


def test_training_depths_are_what_a_parallel_proposal_drafts(target, chain_batch):
    """Depth d of training row t (real rows up to t, masked rows of depths 1..d) gives the logits a proposal's
    masked row d gives after the verified prefix 0..t: the drafter learns what vLLM's parallel pass asks of it."""
    drafter = peagle_for(target, max_draft_tokens=4)
    ids, aux = chain_batch.ids[:2], chain_batch.aux[:2]
    with torch.no_grad():
        trained = drafter.unroll(ids[:, 1:], aux[:, :-1], 4)
        for b in range(2):
            for t in (0, 5, 17, 30):
                # verified positions 0..t: row j pairs token j+1 with the state at j, the last one (token t+1) not
                # yet run by the target; drafts are tokens t+2.. (a fresh cache: the whole prefix in one call)
                drafted = drafter.draft(ids[b, 1 : t + 2], aux[b, : t + 1], 0, 4, drafter.new_cache())
                for depth in range(4):
                    torch.testing.assert_close(drafted[depth], trained[depth][b, t], atol=1e-4, rtol=1e-4)


def test_a_cache_fed_in_steps_drafts_what_a_fresh_one_does(target, chain_batch):
    drafter = peagle_for(target)
    ids, aux = chain_batch.ids[0], chain_batch.aux[0]
    with torch.no_grad():
        cache = drafter.new_cache()
        drafter.draft(ids[1:6], aux[:5], 0, 3, cache)
        assert cache.length == 5  # masked rows are never kept
        drafter.draft(ids[6:13], aux[5:12], 5, 2, cache)
        stepped = drafter.draft(ids[13:21], aux[12:20], 12, 4, cache)
        once = drafter.draft(ids[1:21], aux[:20], 0, 4, drafter.new_cache())
        torch.testing.assert_close(stepped, once, atol=1e-5, rtol=1e-5)


def test_the_parallel_objective_trains_every_depth(target, chain_batch):
    drafter = new_drafter("peagle", target.config, aux_layer_ids=(1, 2, 3), max_draft_tokens=3)
    drafter.initialise_from_target(target)
    optimiser = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    first = drafter.training_loss(chain_batch)
    mask_before = drafter.mask_hidden.detach().clone()
    for _ in range(80):
        loss = drafter.training_loss(chain_batch, ttt_steps=1)  # the drafter's own depths, whatever ttt_steps says
        optimiser.zero_grad()
        loss.total.backward()
        optimiser.step()
    last = drafter.training_loss(chain_batch)
    assert len(last.position_counts) == 3 and all(count > 0 for count in last.position_counts)
    assert last.total < 0.7 * first.total
    before, after = (
        [hits / count for hits, count in zip(loss.position_hits, loss.position_counts, strict=True)]
        for loss in (first, last)
    )
    assert all(later > earlier + 0.2 for earlier, later in zip(before, after, strict=True)), (before, after)
    assert not torch.equal(drafter.mask_hidden, mask_before)  # the masked rows' state is learned
    assert not drafter.embed_tokens.weight.requires_grad


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_speculation_with_a_parallel_proposal_reproduces_greedy_decoding(target, make_chains, gamma):
    drafter = peagle_for(target)
    prompt = make_chains(1, 12, seed=9)[0]
    generation = SpeculativeEngine(target, drafter, gamma).generate(prompt, 40, temperature=0.0)
    assert list(generation.token_ids) == greedy_reference(target, prompt, 40)
    assert generation.stats.draft_tokens > 0 and len(generation.stats.accepted_per_position) == gamma


def test_a_proposal_drafts_no_further_than_it_was_trained(target, make_chains):
    drafter = peagle_for(target, max_draft_tokens=3)
    with pytest.raises(DraftsyncError, match="trained to draft 3 tokens") as raised:
        SpeculativeEngine(target, drafter, 4).generate(make_chains(1, 8, seed=1)[0], 8)
    assert "max_draft_tokens" in raised.value.fix


def test_the_checkpoint_is_the_speculators_peagle_format_vllm_loads(target, tmp_path, make_chains):
    drafter = peagle_for(target, mask_token_id=7, max_draft_tokens=5)
    out = save_drafter(drafter, tmp_path / "peagle", "/models/t", ["LlamaForCausalLM"], 4)
    config = json.loads((out / "config.json").read_text())
    # vLLM's update_peagle: speculators type peagle, mask_token_id (its pard_token), EAGLE-3's fields
    assert config["speculators_model_type"] == "peagle" and config["speculators_config"]["algorithm"] == "peagle"
    assert (config["mask_token_id"], config["max_draft_tokens"], config["draft_vocab_size"]) == (7, 5, 200)
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and config["norm_before_residual"] is True
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert drafter_method(out) == "peagle"
    from safetensors.torch import load_file

    tensors = load_file(out / "model.safetensors")
    # vLLM's Eagle3LlamaForCausalLM copies mask_hidden into a [1, n_aux * target hidden] buffer
    assert tensors["mask_hidden"].shape == (1, 3 * target.config.hidden_size)
    assert {"fc.weight", "layers.0.self_attn.q_proj.weight", "d2t", "t2d", "lm_head.weight"} <= set(tensors)
    loaded = load_drafter(out)
    assert loaded.method == "peagle" and loaded.config.mask_token_id == 7
    prompt = make_chains(1, 12, seed=3)[0]
    want = SpeculativeEngine(target, drafter.to(torch.bfloat16).float(), 4).generate(prompt, 24)
    got = SpeculativeEngine(target, loaded, 4).generate(prompt, 24)
    assert list(got.token_ids) == list(want.token_ids)
    assert got.stats.accepted_per_position == want.stats.accepted_per_position
    with pytest.raises(DraftsyncError, match="gamma 6 was recorded .* trained to draft 5"):
        save_drafter(drafter, tmp_path / "too-far", "/models/t", ["LlamaForCausalLM"], 6)
    assert not (tmp_path / "too-far").exists()


@pytest.mark.parametrize(
    ("options", "names", "fix"),
    [
        ({"mask_token_id": VOCAB}, f"mask token id {VOCAB} is outside the target's vocabulary", "pad token"),
        ({"max_draft_tokens": 0}, "of 0 draft tokens", "between 1 and 16"),
        ({"max_draft_tokens": 17}, "of 17 draft tokens", "between 1 and 16"),
        ({"fc_norm": True}, "fc_norm is not an option of peagle", "norm_before_residual"),
    ],
)
def test_what_vllm_cannot_serve_is_refused_before_training(random_target, options, names, fix):
    with pytest.raises(DraftsyncError, match=names) as raised:
        new_drafter("peagle", random_target.config, None, (1, 2, 3), **options)
    assert fix in raised.value.fix


def test_target_states_are_not_fed_to_masked_rows(target, chain_batch):
    drafter = peagle_for(target)
    with pytest.raises(DraftsyncError, match="ttt_feed=target") as raised:
        drafter.training_loss(chain_batch, 2, feed_target_states=True)
    assert "ttt_feed=drafter" in raised.value.fix
