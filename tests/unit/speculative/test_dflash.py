"""The DFlash drafter: what training computes is what a block drafts, its refusals, and vLLM's checkpoint layout."""

from __future__ import annotations

import json

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.engine.decoding import SpeculativeEngine
from draftsync.speculative.methods.registry import load_drafter, new_drafter, save_drafter

from tests.support.greedy import greedy_reference

VOCAB = 384  # the tiny targets' vocabulary (conftest)


def dflash_for(target, seed=0, **options):
    torch.manual_seed(seed)
    drafter = new_drafter("dflash", target.config, aux_layer_ids=(1, 2, 3), **options)
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


def test_training_blocks_are_what_the_proposer_drafts(target, chain_batch):
    """Every block of a training batch (context before its anchor, its own rows, unmasked among themselves) gives the
    logits `draft` gives from the same verified prefix: the drafter learns what it will be asked."""
    drafter = dflash_for(target, block_size=6)
    anchors = torch.tensor([[3, 17, 30], [1, 9, 38]])
    lengths = torch.tensor([[6, 2, 4], [3, 6, 2]])
    in_block = torch.arange(6)[None, None, :] < lengths[:, :, None]
    batch = chain_batch
    with torch.no_grad():
        trained = drafter.block_training_logits(batch.ids[:2], batch.aux[:2], batch.valid[:2], anchors, in_block)
        for b in range(2):
            for n in range(3):
                anchor, length = int(anchors[b, n]), int(lengths[b, n])
                drafted = drafter.draft(
                    batch.aux[b, :anchor], drafter.new_context(), int(batch.ids[b, anchor]), length - 1
                )
                torch.testing.assert_close(trained[b, n, 1:length], drafted, atol=1e-4, rtol=1e-4)


def test_a_context_fed_in_steps_is_the_context_fed_at_once(target, chain_batch):
    drafter = dflash_for(target)
    aux, ids = chain_batch.aux[0], chain_batch.ids[0]
    with torch.no_grad():
        stepped = drafter.new_context()
        drafter.draft(aux[:5], stepped, int(ids[5]), 3)
        drafter.draft(aux[5:12], stepped, int(ids[12]), 2)
        once = drafter.draft(aux[:20], drafter.new_context(), int(ids[20]), 4)
        torch.testing.assert_close(drafter.draft(aux[12:20], stepped, int(ids[20]), 4), once, atol=1e-5, rtol=1e-5)


def test_the_block_objective_trains_every_position(target, chain_batch):
    drafter = new_drafter("dflash", target.config, aux_layer_ids=(1, 2, 3), block_size=5)
    drafter.initialise_from_target(target)
    optimiser = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    first = drafter.training_loss(chain_batch)
    for step in range(100):
        loss = drafter.training_loss(chain_batch, generator=torch.Generator().manual_seed(step))
        optimiser.zero_grad()
        loss.total.backward()
        optimiser.step()
    last = drafter.training_loss(chain_batch)
    assert last.total < 0.7 * first.total
    assert len(last.position_counts) == 4 and all(count > 0 for count in last.position_counts)
    before, after = (
        [hits / count for hits, count in zip(loss.position_hits, loss.position_counts, strict=True)]
        for loss in (first, last)
    )
    assert all(later > earlier + 0.25 for earlier, later in zip(before, after, strict=True)), (before, after)
    assert not drafter.embed_tokens.weight.requires_grad and not drafter.lm_head.weight.requires_grad


@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_speculation_with_a_block_reproduces_greedy_decoding(target, make_chains, gamma):
    drafter = dflash_for(target)
    prompt = make_chains(1, 12, seed=9)[0]
    generation = SpeculativeEngine(target, drafter, gamma).generate(prompt, 40, temperature=0.0)
    assert list(generation.token_ids) == greedy_reference(target, prompt, 40)
    assert generation.stats.draft_tokens > 0 and len(generation.stats.accepted_per_position) == gamma


def test_a_block_drafts_no_further_than_it_was_trained(target, make_chains):
    drafter = dflash_for(target, block_size=4)
    with pytest.raises(DraftsyncError, match="at most 3 tokens") as raised:
        SpeculativeEngine(target, drafter, 4).generate(make_chains(1, 8, seed=1)[0], 8)
    assert "block_size" in raised.value.fix


def test_the_checkpoint_is_the_layout_vllm_loads(target, tmp_path, make_chains):
    drafter = dflash_for(target, block_size=6, mask_token_id=7)
    out = save_drafter(drafter, tmp_path / "dflash", "/models/t", ["LlamaForCausalLM"], 4)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    # vLLM names a target layer by its output: draftsync's aux id k (the input of layer k) is layer k - 1's output.
    assert config["dflash_config"] == {"mask_token_id": 7, "target_layer_ids": [0, 1, 2]}
    assert (config["block_size"], config["max_draft_tokens"], config["speculative_tokens"]) == (6, 5, 4)
    from safetensors.torch import load_file

    names = set(load_file(out / "model.safetensors"))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "embed_tokens.weight", "lm_head.weight"} <= names
    assert {
        "layers.0.self_attn.q_norm.weight",
        "layers.0.self_attn.k_norm.weight",
        "layers.0.mlp.up_proj.weight",
    } <= names
    loaded = load_drafter(out)
    prompt = make_chains(1, 12, seed=3)[0]
    want = SpeculativeEngine(target, drafter, 5).generate(prompt, 24)
    got = SpeculativeEngine(target, loaded, 5).generate(prompt, 24)
    assert list(got.token_ids) == list(want.token_ids)
    with pytest.raises(DraftsyncError, match="gamma 6 was recorded .* at most 5"):
        save_drafter(drafter, tmp_path / "too-far", "/models/t", ["LlamaForCausalLM"], 6)
    assert not (tmp_path / "too-far").exists()


@pytest.mark.parametrize(
    ("options", "names", "fix"),
    [
        ({"block_size": 1}, "block size 1 is outside 2..16", "block_size between 2"),
        ({"block_size": 17}, "block size 17", "block_size between 2"),
        ({"mask_token_id": VOCAB}, f"mask token id {VOCAB} is outside the target's vocabulary", "pad token"),
        ({"mask_token_id": -1}, "mask token id -1", "token id the target's embedding has"),
        ({"aux_layer_ids": (0, 2, 4)}, "include layer 0", "layers 1 and above"),
        ({"aux_layer_ids": (1, 2, 9)}, r"not distinct ids in \[0, 4\]", "between 0 and 4"),
        ({"draft_vocab_size": 100}, "draft vocabulary of 100 tokens", "lm_head"),
    ],
)
def test_what_vllm_cannot_serve_is_refused_before_training(random_target, options, names, fix):
    options = dict(options)
    aux = options.pop("aux_layer_ids", (1, 2, 3))
    draft_vocab_size = options.pop("draft_vocab_size", None)
    with pytest.raises(DraftsyncError, match=names) as raised:
        new_drafter("dflash", random_target.config, draft_vocab_size, aux, **options)
    assert fix in raised.value.fix
