"""The benchmark's weight-bound target is the demo target padded with work that changes nothing it computes: its
logits and the drafters' aux states are the base target's, and it holds the weights it claims."""

from __future__ import annotations

import json

import pytest
import torch
from bench.padded_target import (
    PADDING_FILE,
    WEIGHT_BOUND,
    PaddedRecipe,
    build_padded_target,
    label,
    padded_state_dict,
    weight_bytes,
)
from draftsync.speculative.builtin.targets import build_target

PROMPTS = ("def add(a, b):\n    return a + b\n\nprint(add(", "The river ran past the old mill and", "x = 3 * 4\ny =")
# The wider MLPs sum the same products in another order: float32 rounding, far below any logit margin that matters.
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    from draftsync.speculative.targets import load_target

    cache = tmp_path_factory.mktemp("targets")
    padded_dir = build_padded_target(WEIGHT_BOUND, cache)
    base_dir = build_target(WEIGHT_BOUND.base(), cache)
    base, tokenizer = load_target(base_dir)
    padded, _ = load_target(padded_dir)
    return base, padded, tokenizer, base_dir, padded_dir


def test_the_weight_bound_target_holds_at_least_256_mib_of_weights(targets):
    _, padded, _, base_dir, padded_dir = targets
    assert weight_bytes(padded_dir) >= 256 * 2**20 > 10 * weight_bytes(base_dir)
    assert padded.config.num_hidden_layers == WEIGHT_BOUND.num_layers
    assert padded.config.intermediate_size == WEIGHT_BOUND.intermediate_size
    record = json.loads((padded_dir / PADDING_FILE).read_text())
    assert record["recipe_key"] == WEIGHT_BOUND.key() and record["weight_bytes"] == weight_bytes(padded_dir)
    assert label(WEIGHT_BOUND, padded_dir).startswith(f"demo-v2 padded to {weight_bytes(padded_dir) / 1e6:.0f} MB")


def test_its_logits_and_greedy_tokens_are_the_base_targets(targets):
    base, padded, tokenizer, _, _ = targets
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            want, got = base(ids).logits[0], padded(ids).logits[0]
            torch.testing.assert_close(got, want, rtol=0, atol=TOLERANCE)
            top2 = want.topk(2).values
            decided = top2[:, 0] - top2[:, 1] > 2 * TOLERANCE  # a position whose greedy token rounding cannot flip
            assert torch.equal(got.argmax(-1)[decided], want.argmax(-1)[decided])


def test_its_aux_states_at_the_drafters_layer_ids_are_the_base_targets(targets):
    from draftsync.speculative.data.hidden_states import capture, default_aux_layer_ids
    from draftsync.speculative.methods.dflash.model import DFlashConfig

    base, padded, tokenizer, _, _ = targets
    # the ids every drafter of the benchmark was trained at (the EAGLE-3 family's and DFlash's defaults on the
    # base), and the last state, which EAGLE-1 and Medusa read
    eagle3_ids = default_aux_layer_ids(base.config.num_hidden_layers)
    dflash_ids = DFlashConfig.for_target(base.config).aux_layer_ids
    layer_ids = tuple(sorted({*eagle3_ids, *dflash_ids, base.config.num_hidden_layers}))
    assert max(layer_ids) < padded.config.num_hidden_layers  # appended layers are past every id read
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            want, got = capture(base, ids, layer_ids), capture(padded, ids, layer_ids)
            torch.testing.assert_close(got.aux, want.aux, rtol=0, atol=TOLERANCE)
            torch.testing.assert_close(got.last, want.last, rtol=0, atol=TOLERANCE)  # the final pre-norm state


def test_appended_layers_write_exactly_nothing_to_the_residual_stream():
    """Deepening alone is exact: the last state of a deeper target equals the base's bit for bit."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2
    )
    torch.manual_seed(0)
    base = LlamaForCausalLM(config).eval()
    tensors = padded_state_dict(base.state_dict(), config.to_dict(), 48, 5, seed=1)
    deeper = LlamaForCausalLM(LlamaConfig(**{**config.to_dict(), "num_hidden_layers": 5})).eval()
    deeper.load_state_dict(tensors)
    ids = torch.arange(10).unsqueeze(0)
    with torch.no_grad():
        want, got = base(ids, output_hidden_states=True), deeper(ids, output_hidden_states=True)
    assert torch.equal(got.logits, want.logits)
    for k in range(2):  # the embeddings and each base layer's output; the last entry is after the final norm
        assert torch.equal(got.hidden_states[k], want.hidden_states[k])
    assert torch.equal(got.hidden_states[-1], want.hidden_states[-1])
    assert not torch.equal(deeper.model.layers[4].mlp.gate_proj.weight, torch.zeros(48, 32))  # the work is real


def test_the_build_is_cached_by_its_recipe(tmp_path):
    small = PaddedRecipe(size="test", intermediate_size=512, num_layers=5)
    first = build_padded_target(small, tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert build_padded_target(small, tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert (first / "chat_template.jinja").exists() and (first / "tokenizer.json").exists()
    other = build_padded_target(PaddedRecipe(size="test", intermediate_size=512, num_layers=5, seed=1), tmp_path)
    assert other != first and PaddedRecipe(size="test").key() != small.key()
