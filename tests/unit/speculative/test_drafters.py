"""The drafter factory, checkpoints of every method, parameter counts, the EAGLE-3 training loss, and what every
method's drafter does alike."""

from __future__ import annotations

import json

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.data.draft_vocab import build_draft_vocab
from draftsync.speculative.data.hidden_states import capture
from draftsync.speculative.data.training_batch import TrainingBatch
from draftsync.speculative.methods import METHODS as PROPERTIES
from draftsync.speculative.methods import TRAINED_METHODS as METHODS
from draftsync.speculative.methods.eagle3.model import DrafterKVCache, Eagle3Config, Eagle3Drafter
from draftsync.speculative.methods.registry import (
    drafter_method,
    load_drafter,
    new_drafter,
    parameter_count,
    save_drafter,
)

VOCAB = 384  # the tiny targets' vocabulary (conftest)


def eagle3_for(target, draft_vocab_size=200, **flags):
    torch.manual_seed(0)
    drafter = Eagle3Drafter(Eagle3Config.for_target(target.config, draft_vocab_size, **flags))
    if draft_vocab_size < VOCAB:
        drafter.set_draft_vocab(*build_draft_vocab(torch.arange(VOCAB, 0, -1), draft_vocab_size))
    return drafter


@pytest.fixture(scope="module")
def chain_batch(target, make_chains, make_training_batch):
    ids = torch.tensor(make_chains(4, 16, seed=3))
    mask = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) > 0.3
    return make_training_batch(target, ids, mask)


# ---- the EAGLE-3 loss ------------------------------------------------------------------------------
def test_eagle3_reports_its_method_and_the_states_it_reads(random_target):
    assert eagle3_for(random_target).method == "eagle3"
    assert eagle3_for(random_target, fc_norm=True, norm_output=True).method == "eagle3.1"
    assert eagle3_for(random_target, fc_norm=True).method == "eagle3"
    assert Eagle3Drafter.target_states == "aux"


def test_eagle3_training_loss_is_the_soft_cross_entropy_of_each_chained_step(target, chain_batch):
    """Written out row by row: step s at row t against the target's distribution at t+s+1, masked at t+s+2."""
    drafter = eagle3_for(target)
    loss = drafter.training_loss(chain_batch, 3, 0.0, None)
    with torch.no_grad():
        steps = drafter.unroll(chain_batch.ids[:, 1:], chain_batch.aux[:, :-1], 3)
    draft_ids = drafter.draft_token_ids
    batch_size, length = chain_batch.ids.shape
    for step, logits in enumerate(steps):
        terms, hits = [], 0
        for b in range(batch_size):
            for t in range(length - 2 - step):
                if not chain_batch.loss_mask[b, t + step + 2]:
                    continue
                target_row = chain_batch.target_logits[b, t + step + 1]
                p = torch.softmax(target_row[draft_ids], -1)
                terms.append(-(p * torch.log_softmax(logits[b, t], -1)).sum())
                hits += int(draft_ids[logits[b, t].argmax()] == target_row.argmax())
        assert loss.position_losses[step] == pytest.approx(float(torch.stack(terms).mean()), rel=1e-5)
        assert loss.position_counts[step] == len(terms) and loss.position_hits[step] == hits
    assert loss.total.item() == pytest.approx(sum(loss.position_losses), rel=1e-5)
    assert loss.total.requires_grad


def test_position_weights_scale_each_chained_step_by_its_power(target, chain_batch):
    drafter = eagle3_for(target)
    loss = drafter.training_loss(chain_batch, 3, 0.0, None)
    assert [k for k, _ in loss.chain_terms] == [0, 1, 2]
    expected = sum(0.8**k * value for k, value in enumerate(loss.position_losses))
    assert loss.weighted_total(0.8).item() == pytest.approx(expected, rel=1e-5)
    assert loss.weighted_total(1.0) is loss.total
    loss.weighted_total(0.8).backward()  # differentiable, as the trainer uses it
    assert drafter.fc.weight.grad is not None


def test_fed_the_targets_states_later_steps_see_the_target_not_the_drafter(target, chain_batch):
    """Step 0 is the same either way. Row t of step 1 is fed the drafter's own step-0 state at t (built from the
    target's states up to t) or, fed the target's, the target's state at t+1: only then does it change with it."""
    drafter = eagle3_for(target)
    ids, aux = chain_batch.ids[:, 1:], chain_batch.aux[:, :-1]
    moved = aux.clone()
    moved[:, 6] += 1.0  # the target's state at position 6 only
    with torch.no_grad():
        own, own_moved = drafter.unroll(ids, aux, 2), drafter.unroll(ids, moved, 2)
        fed = drafter.unroll(ids, aux, 2, feed_target_states=True)
        fed_moved = drafter.unroll(ids, moved, 2, feed_target_states=True)
    assert torch.equal(own[0], fed[0])
    assert torch.allclose(own[1][:, 5], own_moved[1][:, 5])  # row 5 of step 1 has seen states up to 5
    assert not torch.allclose(fed[1][:, 5], fed_moved[1][:, 5])  # fed the target's state at 6
    assert torch.allclose(fed[1][:, :5], fed_moved[1][:, :5])  # and no later one


def test_eagle3_training_loss_falls_on_a_fixed_batch(target, chain_batch):
    drafter = eagle3_for(target)
    drafter.initialise_from_target(target)
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(15):
        loss = drafter.training_loss(chain_batch, 2, 0.0, None)
        optimizer.zero_grad()
        loss.total.backward()
        optimizer.step()
        losses.append(loss.total.item())
    assert losses[-1] < 0.7 * losses[0]


def test_eagle3_training_loss_names_bad_batches(target, chain_batch):
    drafter = eagle3_for(target)
    without_aux = TrainingBatch(
        chain_batch.ids, chain_batch.valid, chain_batch.loss_mask, None, chain_batch.final, chain_batch.target_logits
    )
    with pytest.raises(DraftsyncError, match="aux states"):
        drafter.training_loss(without_aux, 1, 0.0, None)
    with pytest.raises(DraftsyncError, match="ttt_steps"):
        drafter.training_loss(chain_batch, 0, 0.0, None)
    short = TrainingBatch(
        *(
            None if t is None else t[:, :2]
            for t in (
                chain_batch.ids,
                chain_batch.valid,
                chain_batch.loss_mask,
                chain_batch.aux,
                chain_batch.final,
                chain_batch.target_logits,
            )
        )
    )
    with pytest.raises(DraftsyncError, match="3 or more"):
        drafter.training_loss(short, 1, 0.0, None)


# ---- the factory -----------------------------------------------------------------------------------
KINDS = {
    "eagle3": "Eagle3Drafter",
    "eagle3.1": "Eagle3Drafter",
    "eagle": "EagleDrafter",
    "medusa": "MedusaDrafter",
    "dflash": "DFlashDrafter",
    "peagle": "PEagleDrafter",
}
STATES = {"eagle3": "aux", "eagle3.1": "aux", "eagle": "final", "medusa": "final", "dflash": "aux", "peagle": "aux"}


def test_methods_are_the_six_trained_drafters():
    assert METHODS == ("eagle3", "eagle3.1", "eagle", "medusa", "dflash", "peagle")


@pytest.mark.parametrize("method", METHODS)
def test_new_drafter_builds_each_method_for_the_target(random_target, method):
    drafter = new_drafter(method, random_target.config)
    assert type(drafter).__name__ == KINDS[method] and drafter.method == method
    assert drafter.target_states == STATES[method]
    config = drafter.config
    assert (config.vocab_size, config.draft_vocab_size, config.target_hidden_size) == (VOCAB, VOCAB, 64)
    assert isinstance(config.to_dict(), dict)


def test_new_drafter_passes_the_draft_vocabulary_aux_ids_and_options(random_target):
    eagle31 = new_drafter("eagle3.1", random_target.config, 100, (0, 2, 4), norm_before_residual=True)
    assert (eagle31.config.fc_norm, eagle31.config.norm_output, eagle31.config.norm_before_residual) == (True,) * 3
    assert eagle31.config.draft_vocab_size == 100 and eagle31.config.aux_layer_ids == (0, 2, 4)
    medusa = new_drafter("medusa", random_target.config, 100, num_heads=5, num_layers=2)
    assert (medusa.config.num_heads, medusa.config.num_layers, medusa.config.draft_vocab_size) == (5, 2, 100)
    assert new_drafter("eagle", random_target.config, VOCAB).config.draft_vocab_size == VOCAB


def test_new_drafter_names_what_does_not_fit(random_target):
    config = random_target.config
    with pytest.raises(DraftsyncError, match="'eagle4' is unknown") as error:
        new_drafter("eagle4", config)
    assert "eagle3, eagle3.1, eagle, medusa, dflash, peagle" in error.value.fix
    with pytest.raises(DraftsyncError, match="num_heads is not an option of eagle3"):
        new_drafter("eagle3", config, num_heads=3)
    with pytest.raises(DraftsyncError, match="draft vocabulary of 100"):
        new_drafter("eagle", config, 100)
    with pytest.raises(DraftsyncError, match="final hidden state"):
        new_drafter("medusa", config, aux_layer_ids=(1, 2, 3))
    with pytest.raises(DraftsyncError, match="without fc_norm"):
        new_drafter("eagle3.1", config, fc_norm=False)


def _prepared(method, target):
    """A drafter of `method` for `target`, initialised from it, with a draft vocabulary where one applies."""
    torch.manual_seed(1)
    draft_vocab_size = None if PROPERTIES[method].full_vocabulary else 200
    drafter = new_drafter(method, target.config, draft_vocab_size)
    if draft_vocab_size:
        drafter.set_draft_vocab(*build_draft_vocab(torch.arange(VOCAB, 0, -1), draft_vocab_size))
    drafter.initialise_from_target(target)
    with torch.no_grad():
        for name, parameter in drafter.named_parameters():
            if parameter.requires_grad and "embed" not in name:
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(2)))
    return drafter


def _target_states(drafter, target, ids):
    """The target's states the drafter reads (`target_states`), over `ids`."""
    states = capture(target, ids, getattr(drafter.config, "aux_layer_ids", (1, 2, 3)))
    return states.aux if drafter.target_states == "aux" else states.final


def _drafts(drafter, target, ids):
    """What the drafter proposes from the target's states: every TTT step's logits, or every head's."""
    inputs = _target_states(drafter, target, ids)
    with torch.no_grad():
        if drafter.method == "medusa":
            return [drafter.heads(inputs)]
        if drafter.method == "dflash":
            return [drafter.draft(inputs[0, :-1], drafter.new_context(), int(ids[0, -1]), 3)]
        return drafter.unroll(ids[:, 1:], inputs[:, :-1], 2)


@pytest.mark.parametrize("method", METHODS)
def test_save_and_load_round_trip_for_every_method(target, tmp_path, bf16_stored, method):
    drafter = _prepared(method, target)
    out = save_drafter(drafter, tmp_path / method, "/models/target-v1", ["LlamaForCausalLM"], 3)
    assert drafter_method(out) == method
    loaded = load_drafter(out)
    assert type(loaded) is type(drafter) and loaded.method == method
    assert loaded.config.to_dict() == drafter.config.to_dict()
    assert torch.equal(loaded.draft_token_ids, drafter.draft_token_ids)
    reference = bf16_stored(drafter)
    ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(7))
    for got, want in zip(_drafts(loaded, target, ids), _drafts(reference, target, ids), strict=True):
        assert torch.allclose(got, want, atol=1e-5)
    assert next(load_drafter(out, torch.bfloat16).parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("method", METHODS)
def test_a_drafter_for_another_vocabulary_is_refused_from_the_configs(target, tmp_path, method):
    from draftsync.speculative.methods.registry import check_drafter_fits_target

    out = save_drafter(_prepared(method, target), tmp_path / method, "/models/t", ["LlamaForCausalLM"], 2)
    target.config.save_pretrained(tmp_path / "target")
    check_drafter_fits_target(out, tmp_path / "target")  # the target it was built for
    other = target.config.to_dict() | {"vocab_size": VOCAB * 2}
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps(other))
    with pytest.raises(DraftsyncError, match=f"vocabulary of {VOCAB} tokens, target .* has {VOCAB * 2}") as error:
        check_drafter_fits_target(out, tmp_path / "other")
    assert "draftsync sync" in error.value.fix


@pytest.mark.parametrize("method", METHODS)
def test_a_damaged_weights_file_is_named(target, tmp_path, method):
    out = save_drafter(_prepared(method, target), tmp_path / method, "/models/t", ["LlamaForCausalLM"], 2)
    (out / "model.safetensors").write_bytes(b"{broken")
    with pytest.raises(DraftsyncError, match="model.safetensors is not a readable safetensors file") as error:
        load_drafter(out)
    assert "re-" in error.value.fix


def test_a_target_model_directory_is_not_taken_for_a_drafter(random_target, tmp_path):
    random_target.config.save_pretrained(tmp_path / "target")
    with pytest.raises(
        DraftsyncError, match=r"config.json is not the config of a drafter.*model_type='llama'"
    ) as error:
        load_drafter(tmp_path / "target")
    assert "save_drafter" in error.value.fix
    with pytest.raises(DraftsyncError, match="does not exist"):
        drafter_method(tmp_path / "nowhere")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{")
    with pytest.raises(DraftsyncError, match="not valid JSON"):
        load_drafter(tmp_path / "broken")


def test_save_drafter_refuses_what_it_cannot_write(random_target, tmp_path):
    with pytest.raises(DraftsyncError, match="no checkpoint format"):
        save_drafter(torch.nn.Linear(2, 2), tmp_path / "x", "/models/t", ["LlamaForCausalLM"], 2)


def test_parameter_counts_leave_out_the_targets_copies(random_target):
    embedding = VOCAB * 64
    for method in METHODS:
        drafter = new_drafter(method, random_target.config)
        drafter.initialise_from_target(random_target)
        count = parameter_count(drafter)
        assert count.total == sum(p.numel() for p in drafter.parameters())
        assert count.trainable == sum(p.numel() for p in drafter.parameters() if p.requires_grad)
        copies = {
            "eagle3": embedding,
            "eagle3.1": embedding,
            "eagle": 2 * embedding,
            "medusa": 0,
            "dflash": 2 * embedding,
            "peagle": embedding,
        }
        copies = copies[method]
        assert count.own == count.total - copies
    medusa = new_drafter("medusa", random_target.config, 100, num_heads=2)
    assert parameter_count(medusa).own == 2 * (64 * 64 + 64 + 100 * 64)


def test_the_draft_model_baseline_saves_and_loads_through_the_factory(target, tmp_path):
    from draftsync.speculative.methods.draft_model.model import DraftModelDrafter

    drafter = DraftModelDrafter.for_budget(target.config, 60_000).eval()
    out = save_drafter(drafter, tmp_path / "draft-model", "/models/target-v1", ["LlamaForCausalLM"], 4)
    assert drafter_method(out) == "draft_model"
    loaded = load_drafter(out)
    assert type(loaded) is DraftModelDrafter and loaded.method == "draft_model"
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.lm(input_ids=ids).logits, drafter.lm(input_ids=ids).logits, atol=0.05, rtol=0.05
        )  # the checkpoint stores weights as the model holds them


# ---- what every method's drafter does alike ----------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_noise_on_the_input_states_comes_from_the_generator(target, chain_batch, method):
    drafter = _prepared(method, target)
    first = drafter.training_loss(chain_batch, 1, 0.5, torch.Generator().manual_seed(1)).total
    again = drafter.training_loss(chain_batch, 1, 0.5, torch.Generator().manual_seed(1)).total
    other = drafter.training_loss(chain_batch, 1, 0.5, torch.Generator().manual_seed(2)).total
    clean = drafter.training_loss(chain_batch, 1, 0.0, None).total
    assert torch.equal(first, again) and not torch.equal(first, other) and not torch.equal(first, clean)


@pytest.mark.parametrize("method", [m for m in METHODS if PROPERTIES[m].chains])  # not the one-pass drafters
def test_draft_chain_with_cache_equals_the_training_time_test_unroll(random_target, method):
    """The engine's chained steps (KV cache, cropped) along an accepted chain see what training-time test trains."""
    drafter = _prepared(method, random_target)
    ids = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(5))
    inputs = _target_states(drafter, random_target, ids)
    with torch.no_grad():
        unrolled = drafter.unroll(ids[:, 1:], inputs[:, :-1], 3)
        cache = DrafterKVCache()
        logits, hidden = drafter(ids[:, 1:], drafter.fuse(inputs[:, :-1]), torch.arange(9), cache)
        assert torch.allclose(logits, unrolled[0], atol=1e-5)
        for row in range(9):
            cache.crop(row + 1)
            chain_hidden = hidden[:, row : row + 1]
            for step in (1, 2):
                if row + 1 + step > 9:  # the real token fed at this step lies beyond the sequence
                    break
                token = ids[:, row + 1 + step]  # an accepted chain continues with the real tokens
                step_logits, chain_hidden = drafter(token[:, None], chain_hidden, torch.tensor([row + step]), cache)
                assert torch.allclose(step_logits[0, 0], unrolled[step][0, row], atol=1e-5)
            cache.crop(row + 1)
            # re-run the real position that follows, so the cache holds verified positions only again
            if row + 1 < 9:
                drafter(
                    ids[:, row + 2 : row + 3],
                    drafter.fuse(inputs[:, row + 1 : row + 2]),
                    torch.tensor([row + 1]),
                    cache,
                )
