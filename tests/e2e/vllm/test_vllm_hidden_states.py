"""The target's hidden states taken by real vLLM (its CPU build, through draftsync's connector) against the target's
own forward pass in transformers: the same tokens give the same states at every aux layer and after the final norm,
and shards built from either engine hold the same states.

One vLLM start for the module.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.vllm

TEXTS = 6


@pytest.fixture(scope="module")
def target(built_targets):
    from draftsync.speculative.targets import load_target

    model, tokenizer = load_target(built_targets[1])
    return built_targets[1], model, tokenizer


@pytest.fixture(scope="module")
def rows(target):
    """Token ids of task texts of different lengths, as a dataset build sends them."""
    from draftsync.speculative.data.corpora import mixed_texts

    _, _, tokenizer = target
    texts = [text for _, text in mixed_texts({"code": 0.5, "math": 0.5}, TEXTS, seed=11)]
    return [list(tokenizer(text)["input_ids"])[:200] for text in texts]


@pytest.fixture(scope="module")
def reader(target, vllm_engine, tmp_path_factory):
    from draftsync.serving.vllm_states import VllmStateReader
    from draftsync.speculative.data.hidden_states import default_aux_layer_ids, num_decoder_layers
    from draftsync.speculative.data.vllm_connector import captured_layer_ids

    target_dir, model, _ = target
    layers = num_decoder_layers(model)
    captured = captured_layer_ids(default_aux_layer_ids(layers), layers)
    with VllmStateReader(target_dir, captured, tmp_path_factory.mktemp("vllm-states"), engine=vllm_engine) as started:
        yield started


def test_vllm_states_equal_the_transformers_forward_pass_at_every_aux_layer_and_after_the_final_norm(
    target, rows, reader
):
    """float32 on both engines: every layer's max abs difference under 1e-4 and cosine over 0.99999, per token."""
    import torch
    from draftsync.serving.vllm_states import aux_and_final
    from draftsync.speculative.data.hidden_states import capture, default_aux_layer_ids, final_norm_of

    _, model, _ = target
    layers = len(model.get_decoder().layers)
    aux_ids = default_aux_layer_ids(layers)
    taken = reader.states(rows)
    from_vllm = aux_and_final(reader, aux_ids, layers, final_norm_of(model))(rows)
    hidden = model.config.hidden_size
    table: dict[str, dict[str, float]] = {}
    for row, states, (aux, final) in zip(rows, taken, from_vllm, strict=True):
        assert states.shape == (len(row), len(reader.layer_ids), hidden)
        own = capture(model, torch.tensor([row]), aux_ids)
        pairs = {
            f"aux {k}": (own.aux[0, :, i * hidden : (i + 1) * hidden], aux[:, i * hidden : (i + 1) * hidden])
            for i, k in enumerate(aux_ids)
        }
        pairs[f"last ({layers})"] = (own.last[0], states[:, reader.layer_ids.index(layers)])
        pairs["final (normed)"] = (own.final[0], final)
        for name, (expected, got) in pairs.items():
            difference = (expected - got.to(expected.dtype)).abs().max().item()
            cosine = torch.nn.functional.cosine_similarity(expected, got.to(expected.dtype), dim=-1).min().item()
            seen = table.setdefault(name, {"max_abs_difference": 0.0, "min_cosine": 1.0})
            seen["max_abs_difference"] = max(seen["max_abs_difference"], difference)
            seen["min_cosine"] = min(seen["min_cosine"], cosine)
    print(json.dumps({"tokens": sum(map(len, rows)), "rows": len(rows), "per_layer": table}, indent=1))
    assert set(table) == {*(f"aux {k}" for k in aux_ids), f"last ({layers})", "final (normed)"}
    for name, seen in table.items():
        assert seen["max_abs_difference"] < 1e-4, (name, seen)
        assert seen["min_cosine"] > 0.99999, (name, seen)


def test_shards_built_from_vllm_states_hold_the_states_the_transformers_build_holds(target, rows, reader, tmp_path):
    """The same samples through both engines: equal shards (to bfloat16's rounding), each entry naming its engine."""
    import torch
    from draftsync.serving.vllm_states import aux_and_final
    from draftsync.speculative.data.hidden_states import default_aux_layer_ids, final_norm_of
    from draftsync.speculative.data.samples import Sample
    from draftsync.speculative.data.shard_manifest import MANIFEST_FILE
    from draftsync.speculative.data.shard_writer import build_shards
    from safetensors.torch import load_file

    _, model, _ = target
    layers = len(model.get_decoder().layers)
    aux_ids = default_aux_layer_ids(layers)
    samples = [Sample("code", row, [0] + [1] * (len(row) - 1)) for row in rows]
    source = aux_and_final(reader, aux_ids, layers, final_norm_of(model))
    built = {}
    for engine, states in (("transformers", None), ("vllm", source)):
        out = tmp_path / engine
        kwargs = {} if states is None else {"states": states, "states_engine": engine}
        manifest = build_shards(model, samples, out, aux_ids, shard_tokens=400, batch_size=4, **kwargs)
        assert {shard["states_engine"] for shard in manifest["shards"]} == {engine}
        assert json.loads((out / MANIFEST_FILE).read_text())["complete"]
        built[engine] = [load_file(str(out / shard["file"])) for shard in manifest["shards"]]
    assert len(built["vllm"]) == len(built["transformers"]) > 1
    for ours, theirs in zip(built["transformers"], built["vllm"], strict=True):
        assert torch.equal(ours["input_ids"], theirs["input_ids"])
        for key in ("aux", "final"):
            expected, got = ours[key].float(), theirs[key].float()
            assert expected.shape == got.shape
            scale = expected.abs().max().item()
            assert (expected - got).abs().max().item() <= 2**-7 * scale, key  # one bfloat16 step of the largest
