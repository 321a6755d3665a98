"""Refreshing a target's own MTP head: the trunk frozen, the head's layer learning the target's answers, the target
left as it was (no hook left on it), and a head of another depth refused."""

from __future__ import annotations

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.methods.mtp.model import new_mtp
from draftsync.speculative.train.mtp_refresh import refresh_head

from tests.unit.speculative.test_mtp_head import VOCAB, chain_qwen2_target, qwen2_config


def _samples(count: int = 12, length: int = 24) -> list[tuple[list[int], list[int]]]:
    generator = torch.Generator().manual_seed(3)
    rows = []
    for _ in range(count):
        ids = torch.randint(0, VOCAB, (length,), generator=generator).tolist()
        rows.append((ids, [0] * 4 + [1] * (length - 4)))  # a 4-token prompt, then the answer it learns
    return rows


def test_a_refresh_trains_the_heads_layer_alone_and_leaves_the_target_as_it_was():
    target, _ = chain_qwen2_target()
    before = {name: p.detach().clone() for name, p in target.named_parameters()}
    head = new_mtp(target.config)
    head.initialise_from_target(target)
    layer_before = {name: p.detach().clone() for name, p in head.layer.named_parameters()}
    losses = refresh_head(target, head, _samples(), steps=30, lr=3e-3, batch_size=4, window=24, seed=1)
    assert len(losses) == 30 and sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, losses
    assert all(torch.equal(p, before[name]) for name, p in target.named_parameters()), "the trunk moved"
    assert any(not torch.equal(p, layer_before[name]) for name, p in head.layer.named_parameters())
    assert not target.model.norm._forward_hooks, "the refresh left its hook on the target"
    assert not head.training


def test_a_refresh_refuses_a_head_of_another_depth_and_no_answers():
    target, _ = chain_qwen2_target()
    other = new_mtp(qwen2_config(layers=3))
    with pytest.raises(DraftsyncError, match="reads layer"):
        refresh_head(target, other, _samples(), steps=1)
    with pytest.raises(DraftsyncError, match="no samples"):
        refresh_head(target, new_mtp(target.config), [], steps=1)
