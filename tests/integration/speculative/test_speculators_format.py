"""EAGLE-3 drafters on disk in the speculators format vLLM detects."""

from __future__ import annotations

import json

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.engine.decoding import SpeculativeEngine
from draftsync.speculative.methods.checkpoint_files import SavedFor
from draftsync.speculative.methods.eagle3.checkpoint import load_eagle3, save_eagle3
from draftsync.speculative.methods.eagle3.model import Eagle3Config, Eagle3Drafter
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tests.support.greedy import greedy_reference

TOP_LEVEL_KEYS = {
    "architectures",
    "speculators_model_type",
    "speculators_version",
    "speculators_config",
    "transformer_layer_config",
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids",
    "norm_before_residual",
    "norm_before_fc",
    "fc_norm",
    "norm_output",
    "embed_requires_grad",
    "torch_dtype",
    "transformers_version",
}


def save(drafter, directory, gamma=3):
    return save_eagle3(drafter, directory, SavedFor("/models/target-v1", ("LlamaForCausalLM",), gamma))


def test_config_has_the_speculators_eagle3_fields(trained_drafter, tmp_path):
    config = json.loads((save(trained_drafter, tmp_path / "d") / "config.json").read_text())
    assert set(config) == TOP_LEVEL_KEYS
    assert config["architectures"] == ["Eagle3DraftModel"]
    assert config["speculators_model_type"] == "eagle3"
    assert config["speculators_config"] == {
        "algorithm": "eagle3",
        "proposal_methods": [
            {"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1, "accept_tolerance": 0.0}
        ],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": "/models/target-v1", "architectures": ["LlamaForCausalLM"]},
    }
    assert config["draft_vocab_size"] == 256 and config["target_hidden_size"] == 64
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert (config["norm_before_residual"], config["norm_before_fc"], config["fc_norm"], config["norm_output"]) == (
        True,
        False,
        False,
        False,
    )
    layer = config["transformer_layer_config"]
    assert layer["model_type"] == "llama" and layer["vocab_size"] == 384 and layer["hidden_act"] == "silu"
    assert layer["num_hidden_layers"] == 1 and layer["hidden_size"] == 64 and layer["head_dim"] == 16


def test_transformer_layer_config_loads_as_a_llama_config(trained_drafter, tmp_path):
    from transformers import LlamaConfig

    layer = json.loads((save(trained_drafter, tmp_path / "d") / "config.json").read_text())["transformer_layer_config"]
    config = LlamaConfig(**layer)
    assert (config.vocab_size, config.hidden_size, config.head_dim, config.num_key_value_heads) == (384, 64, 16, 4)
    assert config.rope_parameters["rope_theta"] == trained_drafter.config.rope_theta


def test_weights_have_the_speculators_names_in_bf16(trained_drafter, tmp_path):
    directory = save(trained_drafter, tmp_path / "d")
    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
        tensors = {name: handle.get_tensor(name) for name in names}
    assert names == set(trained_drafter.state_dict())
    assert {"fc.weight", "lm_head.weight", "d2t", "t2d", "layers.0.hidden_norm.weight"} <= names
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert all(t.dtype == torch.bfloat16 for n, t in tensors.items() if n not in ("d2t", "t2d"))
    assert tuple(tensors["fc.weight"].shape) == (64, 192) and tuple(tensors["lm_head.weight"].shape) == (256, 64)
    assert tuple(tensors["layers.0.self_attn.q_proj.weight"].shape) == (64, 128)


def test_round_trip_keeps_weights_vocab_and_behaviour(target, trained_drafter, tmp_path, make_chains):
    loaded = load_eagle3(save(trained_drafter, tmp_path / "d"))
    assert loaded.config == trained_drafter.config
    for name, tensor in trained_drafter.state_dict().items():
        expected = tensor.to(torch.bfloat16).float() if tensor.is_floating_point() else tensor
        assert torch.equal(loaded.state_dict()[name], expected), name
    prompt = make_chains(1, 6, seed=5)[0]
    generation = SpeculativeEngine(target, loaded, 3).generate(prompt, 20)
    assert generation.token_ids == greedy_reference(target, prompt, 20)
    assert generation.stats.acceptance_rate > 0.5


def test_eagle31_flags_produce_per_state_norms(target, tmp_path):
    drafter = Eagle3Drafter(Eagle3Config.for_target(target.config, 200, fc_norm=True, norm_output=True))
    directory = save(drafter, tmp_path / "d31")
    config = json.loads((directory / "config.json").read_text())
    assert config["fc_norm"] is True and config["norm_output"] is True and config["norm_before_fc"] is False
    names = set(load_file(str(directory / "model.safetensors")))
    assert {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"} <= names
    assert "input_norm.weight" not in names
    assert load_eagle3(directory).config == drafter.config


def test_full_vocabulary_drafter_has_no_mapping_buffers(target, tmp_path):
    directory = save(Eagle3Drafter(Eagle3Config.for_target(target.config)), tmp_path / "full")
    names = set(load_file(str(directory / "model.safetensors")))
    assert "d2t" not in names and "t2d" not in names
    assert json.loads((directory / "config.json").read_text())["draft_vocab_size"] == 384
    assert load_eagle3(directory).d2t is None


# ---- bad directories -------------------------------------------------------------------------------
@pytest.fixture()
def saved(trained_drafter, tmp_path):
    return save(trained_drafter, tmp_path / "saved")


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(DraftsyncError, match="does not exist"):
        load_eagle3(tmp_path / "nowhere")


def test_missing_config_is_named(saved):
    (saved / "config.json").unlink()
    with pytest.raises(DraftsyncError, match="config.json is missing"):
        load_eagle3(saved)


def test_unparsable_config_is_named(saved):
    (saved / "config.json").write_text("{not json")
    with pytest.raises(DraftsyncError, match="not valid JSON"):
        load_eagle3(saved)


def test_wrong_model_type_is_named(saved):
    config = json.loads((saved / "config.json").read_text())
    config["speculators_model_type"] = "eagle"
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsyncError, match="speculators_model_type 'eagle'"):
        load_eagle3(saved)


def test_missing_weights_file_is_named(saved):
    (saved / "model.safetensors").unlink()
    with pytest.raises(DraftsyncError, match="model.safetensors is missing"):
        load_eagle3(saved)


def test_corrupt_weights_are_named(saved):
    (saved / "model.safetensors").write_bytes(b"\x00\x01 definitely not safetensors")
    with pytest.raises(DraftsyncError, match="not a readable safetensors"):
        load_eagle3(saved)


def test_missing_tensors_are_named(saved):
    tensors = load_file(str(saved / "model.safetensors"))
    del tensors["fc.weight"]
    save_file(tensors, str(saved / "model.safetensors"))
    with pytest.raises(DraftsyncError, match="fc.weight"):
        load_eagle3(saved)


def test_config_without_required_fields_is_named(saved):
    config = json.loads((saved / "config.json").read_text())
    del config["transformer_layer_config"]
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsyncError, match="lacks a field"):
        load_eagle3(saved)


def test_saving_needs_a_positive_gamma(trained_drafter, tmp_path):
    with pytest.raises(DraftsyncError, match="speculative_tokens"):
        save_eagle3(trained_drafter, tmp_path / "x", SavedFor("t", ("LlamaForCausalLM",), 0))


@pytest.mark.parametrize(
    "layer_change", [{"num_hidden_layers": 2}, {"layer_types": ["sliding_attention"], "sliding_window": 2048}]
)
def test_drafters_of_another_shape_are_refused_not_read_as_one_full_attention_layer(saved, layer_change):
    config = json.loads((saved / "config.json").read_text())
    config["transformer_layer_config"].update(layer_change)
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsyncError, match="one full-attention layer") as error:
        load_eagle3(saved)
    assert "--num-layers 1" in error.value.fix
