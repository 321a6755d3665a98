"""Training places the target's tensors it reads on the training device without moving the target's own modules.

The meta device stands for a GPU other than the one the target's tensors live on: on a CPU it is the one other device.
"""

from __future__ import annotations

import pytest
import torch
from draftsync.speculative.methods.eagle3.model import Eagle3Config, Eagle3Drafter
from draftsync.speculative.train.target_tensors import placed_for_training, released_from_target, training_head

ELSEWHERE = torch.device("meta")


@pytest.fixture
def fresh_target():
    from tests.support.speculative_fixtures import tiny_llama

    return tiny_llama(seed=0)


def eagle3_for(target) -> Eagle3Drafter:
    drafter = Eagle3Drafter(Eagle3Config.for_target(target.config))
    drafter.initialise_from_target(target, freeze_embeddings=True)
    return drafter


def test_the_training_head_is_the_targets_own_only_on_the_training_device(fresh_target):
    lm_head = fresh_target.get_output_embeddings()
    assert training_head(fresh_target, torch.device("cpu")) is lm_head
    copy = training_head(fresh_target, ELSEWHERE)
    assert copy is not lm_head and copy.weight.device == ELSEWHERE and not copy.weight.requires_grad
    assert copy.weight.dtype == lm_head.weight.dtype
    assert lm_head.weight.device.type == "cpu"  # the target's head stays where its hooks send inputs


def test_the_drafter_shares_the_targets_embedding_only_on_the_training_device(fresh_target):
    embedding = fresh_target.get_input_embeddings().weight
    same = placed_for_training(eagle3_for(fresh_target), fresh_target, torch.device("cpu"))
    assert same.embed_tokens.weight is embedding  # held once where both live

    elsewhere = placed_for_training(eagle3_for(fresh_target), fresh_target, ELSEWHERE)
    assert elsewhere.embed_tokens.weight is not embedding
    assert elsewhere.embed_tokens.weight.device == ELSEWHERE and not elsewhere.embed_tokens.weight.requires_grad
    assert elsewhere.embed_tokens.weight.dtype == embedding.dtype  # the frozen copy in the target's dtype
    assert all(p.device.type == "cpu" for p in fresh_target.parameters())


def test_a_drafter_released_from_the_target_moves_alone(fresh_target):
    drafter = placed_for_training(eagle3_for(fresh_target), fresh_target, torch.device("cpu"))
    drafter = released_from_target(drafter, fresh_target, torch.device("cpu"))
    target_storage = {p.untyped_storage().data_ptr() for p in fresh_target.parameters()}
    assert not target_storage & {p.untyped_storage().data_ptr() for p in drafter.parameters()}
    assert torch.equal(drafter.embed_tokens.weight, fresh_target.get_input_embeddings().weight)
    drafter.to(ELSEWHERE)
    assert all(p.device.type == "cpu" for p in fresh_target.parameters())
