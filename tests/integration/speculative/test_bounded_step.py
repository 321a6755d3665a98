"""A training step bounded by design computes the loss and gradients of the plain step.

The plain step is the one before memory bounds: the target's logits over its whole vocabulary in fp32, the draft
vocabulary's columns picked from them, the soft cross-entropy taken whole, and one batch padded to seq_len.
"""

from __future__ import annotations

import copy

import pytest
import torch
from draftsync.speculative.methods import loss as draft_loss
from draftsync.speculative.train.batches import micro_batches, with_target_logits
from draftsync.speculative.train.config import TrainConfig
from draftsync.speculative.train.drafters import new_drafter_for, warm_start
from draftsync.speculative.train.training import fit_drafter, optimisation_step

SMALL = dict(draft_vocab_size=256, batch_size=8, seq_len=32, seed=0)


def plain_soft_cross_entropy(draft_logits, target_logits, weight):
    target_probs = torch.softmax(target_logits.float(), dim=-1)
    per_row = -(target_probs * torch.log_softmax(draft_logits.float(), dim=-1)).sum(-1)
    weight = weight.float()
    return (per_row * weight).sum() / weight.sum().clamp_min(1.0)


@pytest.mark.parametrize("chunk_elements", [1 << 24, 300, 7])  # whole batch rows, several rows, part of one row
def test_the_chunked_loss_has_the_plain_losss_value_and_gradient(monkeypatch, chunk_elements):
    monkeypatch.setattr(draft_loss, "LOSS_CHUNK_ELEMENTS", chunk_elements)
    generator = torch.Generator().manual_seed(0)
    draft = torch.randn(3, 11, 40, generator=generator, requires_grad=True)
    target = torch.randn(3, 11, 40, generator=generator) * 3
    weight = torch.rand(3, 11, generator=generator) > 0.3
    chunked = draft_loss.soft_cross_entropy(draft, target, weight)
    (chunked_grad,) = torch.autograd.grad(chunked, draft)
    plain = plain_soft_cross_entropy(draft, target, weight)
    (plain_grad,) = torch.autograd.grad(plain, draft)
    assert torch.allclose(chunked, plain, atol=1e-6)
    assert torch.allclose(chunked_grad, plain_grad, atol=1e-7)


def test_draft_vocabulary_logits_keep_the_targets_greedy_token_over_its_whole_vocabulary(target, chain_shards):
    drafter = new_drafter_for(target, chain_shards, TrainConfig(**{**SMALL, "draft_vocab_size": 64}))
    columns = drafter.draft_token_ids
    head = target.get_output_embeddings()
    batch = chain_shards.batch(chain_shards.windows([0, 1, 2], 32), 32)
    whole = with_target_logits(copy.copy(batch), head).target_logits
    restricted = with_target_logits(copy.copy(batch), head, columns=columns)
    assert restricted.target_logits.shape[-1] == 64 < whole.shape[-1]
    assert torch.equal(restricted.target_logits, whole.index_select(-1, columns))
    assert torch.equal(restricted.target_greedy(), whole.argmax(-1))
    assert (~torch.isin(whole.argmax(-1), columns)).any()  # some greedy tokens lie outside: agreement must see them


def one_step(drafter, micro, head, config):
    parameters = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=config.lr)
    plain_precision = torch.autocast("cpu", enabled=False)
    result = optimisation_step(drafter, micro, head, optimizer, parameters, config, 0, plain_precision)
    return result, {name: p.grad.clone() for name, p in drafter.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("method", ["eagle3", "medusa"])
def test_a_bounded_step_has_the_plain_steps_loss_counts_and_gradients(monkeypatch, target, chain_shards, method):
    config = TrainConfig(method=method, ttt_steps=3, medusa_heads=3, **{**SMALL, "draft_vocab_size": 64})
    drafter = new_drafter_for(target, chain_shards, config)
    head = target.get_output_embeddings()
    windows = chain_shards.windows(list(range(chain_shards.num_sequences)), 32)[:8]

    plain_batch = chain_shards.batch(windows, 32)
    plain_batch.target_logits = head(plain_batch.final).float()  # the whole vocabulary, as the plain step had it
    monkeypatch.setattr(draft_loss, "soft_cross_entropy", plain_soft_cross_entropy)
    plain, plain_grads = one_step(copy.deepcopy(drafter), [plain_batch], head, config)
    monkeypatch.undo()

    monkeypatch.setattr(draft_loss, "LOSS_CHUNK_ELEMENTS", 1000)
    groups = micro_batches(windows, batch_tokens=3 * 32)
    assert len(groups) == 3
    micro = [chain_shards.batch(group) for group in groups]
    bounded, bounded_grads = one_step(copy.deepcopy(drafter), micro, head, config)

    assert bounded.position_hits == plain.position_hits and bounded.position_counts == plain.position_counts
    assert float(bounded.total) == pytest.approx(float(plain.total), rel=1e-4)
    for name, grad in plain_grads.items():
        cosine = torch.nn.functional.cosine_similarity(grad.flatten(), bounded_grads[name].flatten(), dim=0)
        assert cosine > 0.9999, name
        assert grad.norm() == pytest.approx(float(bounded_grads[name].norm()), rel=1e-3), name


def test_micro_batches_cover_the_steps_windows_once_within_the_token_budget():
    lengths = torch.tensor([5, 32, 17, 32, 3, 9, 30, 12])
    windows = torch.stack([torch.arange(8), torch.zeros(8, dtype=torch.long), lengths], dim=1)
    groups = micro_batches(windows, batch_tokens=40)
    assert sorted(torch.cat(groups)[:, 0].tolist()) == list(range(8))
    for group in groups:
        assert len(group) * int(group[:, 2].max()) <= 40 or len(group) == 1
    assert len(micro_batches(windows, batch_tokens=8)) == 8  # a window over the budget trains alone
    assert len(micro_batches(windows, None)) == 1


def test_training_with_checkpointing_and_token_budgets_follows_the_plain_run(target, chain_shards):
    plain_config = TrainConfig(steps=12, **SMALL)
    bounded_config = TrainConfig(steps=12, batch_tokens=64, activation_checkpointing=True, **SMALL)
    assert plain_config.fingerprint() == bounded_config.fingerprint()  # a checkpoint resumes across memory layouts
    _, plain = fit_drafter(target, chain_shards, plain_config)
    _, bounded = fit_drafter(target, chain_shards, bounded_config)
    assert plain.tokens == bounded.tokens
    assert bounded.losses == pytest.approx(plain.losses, rel=1e-3)
    assert bounded.top1_agreement == pytest.approx(plain.top1_agreement, abs=0.01)


def test_the_frozen_embedding_is_the_targets_own_tensor_out_of_the_optimiser_and_kept_by_a_warm_start(
    target, chain_shards
):
    drafter = new_drafter_for(target, chain_shards, TrainConfig(**SMALL))
    embedding = target.get_input_embeddings().weight
    assert drafter.embed_tokens.weight is embedding  # held once: no copy beside the target's
    assert all(p is not embedding for p in drafter.parameters() if p.requires_grad)
    before = embedding.detach().clone()
    previous = new_drafter_for(target, chain_shards, TrainConfig(**{**SMALL, "seed": 1}))
    previous.embed_tokens.weight = torch.nn.Parameter(torch.randn_like(before), requires_grad=False)  # another target's
    assert warm_start(drafter, previous) > 0
    assert torch.equal(drafter.embed_tokens.weight, before)  # this target's embedding, not the previous one's
