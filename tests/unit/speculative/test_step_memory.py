"""The training step's memory model counts what the real drafter holds: its parameter counts against a drafter built
at Llama-3-like proportions (grouped-query attention, a draft vocabulary), and its parts scale as the shapes do. How
close the total comes to a measured peak is bench/train_memory.py's to say."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from draftsync.speculative.train.step_memory import BF16, FP32, StepShape, drafter_parameters, predict_step_memory
from transformers import LlamaConfig


def _config(**changes) -> LlamaConfig:
    shape = {
        "hidden_size": 256,
        "intermediate_size": 896,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 3000,
        "num_hidden_layers": 8,
    }
    return LlamaConfig(**{**shape, **changes})


@pytest.mark.parametrize("draft_vocab", [3000, 512])
def test_the_parameter_counts_are_the_drafters_own(draft_vocab):
    from draftsync.speculative.methods.registry import new_drafter

    config = _config()
    drafter = new_drafter("eagle3", config, draft_vocab, (1, 4, 6))
    drafter.initialise_from_target(_target(config), freeze_embeddings=True)
    trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in drafter.parameters() if not p.requires_grad)
    shape = StepShape.for_target(config, draft_vocab, batch=2, seq_len=64, ttt_steps=3)
    assert drafter_parameters(shape) == (trainable, frozen)


def _target(config: LlamaConfig):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def test_the_parts_scale_with_tokens_and_steps_and_the_weights_do_not():
    config = _config()
    base = predict_step_memory(StepShape.for_target(config, 512, batch=1, seq_len=128, ttt_steps=2))
    longer = predict_step_memory(StepShape.for_target(config, 512, batch=2, seq_len=128, ttt_steps=2))
    deeper = predict_step_memory(StepShape.for_target(config, 512, batch=1, seq_len=128, ttt_steps=4))
    for part in ("drafter_weights", "adam_moments", "gradients", "target_head"):
        assert base[part] == longer[part] == deeper[part]
    # the target's logits over the draft vocabulary only, and its greedy ids: never [tokens x vocabulary]
    assert longer["target_logits"] == 2 * base["target_logits"] == 2 * (FP32 * 128 * 512 + 8 * 128)
    assert base["activations"] < deeper["activations"] < longer["activations"] == 2 * base["activations"]
    assert base["total"] == sum(value for part, value in base.items() if part != "total")


def test_checkpointing_shrinks_the_activations_only_and_bf16_the_16_bit_parts():
    config = _config()
    plain = predict_step_memory(StepShape.for_target(config, 512, batch=4, seq_len=256, ttt_steps=4))
    kept = predict_step_memory(StepShape.for_target(config, 512, batch=4, seq_len=256, ttt_steps=4, checkpointing=True))
    half = predict_step_memory(
        StepShape.for_target(config, 512, batch=4, seq_len=256, ttt_steps=4, activation_bytes=BF16, head_bytes=BF16)
    )
    assert kept["activations"] < plain["activations"]
    assert {k: v for k, v in kept.items() if k not in ("activations", "total")} == {
        k: v for k, v in plain.items() if k not in ("activations", "total")
    }
    assert half["activations"] * 2 == plain["activations"] and half["target_head"] * 2 == plain["target_head"]
    trainable, frozen = drafter_parameters(StepShape.for_target(config, 512, 4, 256, 4))
    assert half["autocast_copies"] == BF16 * trainable
    assert half["drafter_weights"] == FP32 * trainable + BF16 * frozen  # the embedding is the target's, in its dtype


def test_a_dflash_steps_parameter_counts_are_the_drafters_own():
    from draftsync.speculative.methods.registry import new_drafter

    config = _config()
    drafter = new_drafter("dflash", config, None, (1, 4, 6), num_hidden_layers=2)
    drafter.initialise_from_target(_target(config))
    trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in drafter.parameters() if not p.requires_grad)
    shape = StepShape.for_target(config, 3000, batch=2, seq_len=64, ttt_steps=1)
    assert drafter_parameters(replace(shape, draft_layers=2, block_rows=16 * 8)) == (trainable, frozen)


def test_a_dflash_step_grows_with_its_block_and_its_window():
    config = _config()
    chained = StepShape.for_target(config, 3000, batch=2, seq_len=256, ttt_steps=1)
    small = predict_step_memory(replace(chained, block_rows=16 * 4))
    large = predict_step_memory(replace(chained, block_rows=16 * 16))
    longer = predict_step_memory(replace(chained, seq_len=512, block_rows=16 * 4))
    assert small["activations"] < large["activations"] and small["activations"] < longer["activations"]
    assert small["target_logits"] < large["target_logits"]  # the target's logits gathered at the rows too
    assert small["drafter_weights"] == large["drafter_weights"] and small["total"] == sum(
        value for part, value in small.items() if part != "total"
    )
