"""The one description of a target (speculative/target_description.py), read from config-only checkpoints of targets
teams serve: parameters total and active, weights at their quantization, against what their publishers give; and
the configs it refuses, for the plan and the sync alike."""

from __future__ import annotations

import json

import pytest
from draftsync.errors import DraftsyncError
from draftsync.speculative.target_description import describe, describe_config

from tests.support.published_targets import PUBLISHED_BYTES, PUBLISHED_PARAMETERS, save_published_configs


@pytest.fixture(scope="module")
def described(tmp_path_factory):
    root = save_published_configs(tmp_path_factory.mktemp("published"))
    return {name: describe(root / name) for name in PUBLISHED_BYTES}


@pytest.mark.parametrize("name", sorted(PUBLISHED_BYTES))
def test_a_published_target_is_counted_and_weighed_as_its_publisher_gives_it(described, name):
    described = described[name]
    total, active = PUBLISHED_PARAMETERS[name]
    assert described.parameters == pytest.approx(total, rel=0.02)
    counted_active = described.active_parameters
    if name == "gpt-oss-20b":  # its card counts a token's parameters without the embedding table
        counted_active -= described.vocab * described.hidden
    assert counted_active == pytest.approx(active, rel=0.05)
    assert described.checkpoint_bytes_from == "config"
    assert described.checkpoint_bytes == pytest.approx(PUBLISHED_BYTES[name], rel=0.05)


def test_what_sets_a_target_apart_is_read_from_its_config(described):
    deepseek = described["deepseek-v3"]
    assert deepseek.attention == "mla" and deepseek.mtp_layers == 1
    assert deepseek.kv_bytes_per_token == 61 * (512 + 64) * 2  # the latent and the rope key, not 128 heads' keys
    assert 11e9 < deepseek.mtp_parameters < 14e9  # one MoE layer and its projection: weighed, not loaded
    assert deepseek.checkpoint_bytes > deepseek.weight_bytes
    assert (deepseek.experts.routed, deepseek.experts.per_token, deepseek.experts.shared) == (256, 8, 1)
    oss = described["gpt-oss-20b"]
    assert oss.quantization.method == "mxfp4" and oss.quantization.experts_only
    llama = described["llama-3.1-70b-fp8"]
    assert llama.experts is None and llama.active_parameters == llama.parameters
    assert llama.quantization.label() == "compressed-tensors (8-bit)"
    # 16-bit embeddings and lm_head, 8-bit linear layers: just over half the 16-bit checkpoint
    assert 0.5 < llama.weight_bytes / (2 * llama.parameters) < 0.53


TINY = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}


@pytest.mark.parametrize(
    ("change", "said", "fix"),
    [
        (
            {"num_experts_per_tok": None},
            "declares 4 experts but not how many run for each token",
            "num_experts_per_tok",
        ),
        ({"num_experts_per_tok": 6}, "routes each token to 6 of its 4 experts", "between 1 and the number of experts"),
        ({"num_hidden_layers": 0}, "declares num_hidden_layers 0", "config the model was saved with"),
        (
            {"quantization_config": {"quant_method": "exl3", "bits": 4}},
            "quant_method 'exl3', which draftsync cannot size",
            "fp8, compressed-tensors, awq, gptq, mxfp4",
        ),
    ],
    ids=["experts-without-per-token", "more-per-token-than-experts", "zero-layers", "unknown-quantization"],
)
def test_a_config_that_cannot_be_sized_is_refused_by_the_plan_and_the_sync_alike(tmp_path, change, said, fix):
    from draftsync.planning.target_shape import TargetShape
    from draftsync.speculative.targets import describe_target

    config = {k: v for k, v in {**TINY, **change}.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    refusals = []
    for reader in (TargetShape.from_directory, describe_target):  # the plan's first step, and the sync's
        with pytest.raises(DraftsyncError) as refused:
            reader(tmp_path)
        refusals.append(refused.value)
    assert [r.what for r in refusals] == [refusals[0].what] * 2
    assert said in refusals[0].what and str(tmp_path) in refusals[0].what and fix in refusals[0].fix


def test_a_quantized_checkpoint_is_checked_against_its_weight_files(tmp_path):
    import torch
    from safetensors.torch import save_file

    declared = {**TINY, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (tmp_path / "config.json").write_text(json.dumps(declared))
    save_file({"model.embed_tokens.weight": torch.zeros(128, 32, dtype=torch.bfloat16)}, tmp_path / "model.safetensors")
    with pytest.raises(DraftsyncError) as refused:
        describe(tmp_path)
    assert "declares fp8 (8-bit) weights, but its safetensors hold only BF16 tensors" in refused.value.what
    assert "quantization_config" in refused.value.fix

    save_file(
        {"model.layers.0.mlp.down_proj.weight": torch.zeros(32, 64, dtype=torch.float8_e4m3fn)},
        tmp_path / "model.safetensors",
    )
    assert describe(tmp_path).checkpoint_bytes == 32 * 64  # what the files hold, read from their headers
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    with pytest.raises(DraftsyncError, match="stores float8 weights but its config.json declares no quantization"):
        describe(tmp_path)


def test_a_family_a_sync_refuses_is_still_described_for_the_plan():
    refused = describe_config({**TINY, "architectures": ["PhimoeForCausalLM"], "model_type": "phimoe"}, "x", "x")
    assert refused.unsupported is not None and refused.parameters > 0
    with pytest.raises(DraftsyncError):
        refused.require_supported()


DENSE = {k: v for k, v in TINY.items() if k not in ("num_local_experts", "num_experts_per_tok")}
MIMO = {**DENSE, "architectures": ["MiMoForCausalLM"], "model_type": "qwen2", "num_nextn_predict_layers": 1}


def test_a_target_that_ships_its_own_mtp_head_is_known_by_its_config():
    described = describe_config(MIMO, "mimo", "target mimo")
    assert described.mtp_layers == 1 and described.mtp_parameters > 0
    assert described.summary()["mtp_head"] == {
        "family": "mimo",
        "layers": 1,
        "served_layers": 1,
        "reads": "pre_norm",
        "refreshed_by_draftsync": True,
    }
    assert "its own MTP head (mimo): 1 layer(s)" in described.text()
    assert "a head draftsync can refresh" in described.text()
    # its trunk is a Qwen 2 and a sync keeps its head in step (flows/sync.py): described, not refused
    assert described.unsupported is None
    qwen35 = {"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": {"mtp_num_hidden_layers": 1}}
    from draftsync.speculative.mtp_heads import mtp_head_of

    assert mtp_head_of(qwen35, "q").summary()["family"] == "qwen3_5"  # declared inside its text_config
    assert mtp_head_of({**MIMO, "num_nextn_predict_layers": 0}, "m") is None


def test_more_mtp_layers_than_vllm_serves_are_refused_naming_the_count_and_the_fix():
    with pytest.raises(DraftsyncError) as refused:
        describe_config({**MIMO, "num_nextn_predict_layers": 2}, "mimo", "target mimo")
    assert "declares 2 MTP layers (num_nextn_predict_layers)" in refused.value.what
    assert "serves only 1" in refused.value.what and "set num_nextn_predict_layers to 1" in refused.value.fix


def test_mtp_layers_declared_but_absent_from_the_weights_are_refused(tmp_path):
    import torch
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps(MIMO))
    trunk = {"model.embed_tokens.weight": torch.zeros(128, 32)}
    save_file(trunk, tmp_path / "model.safetensors")
    with pytest.raises(DraftsyncError) as refused:
        describe(tmp_path)
    assert "declares 1 MTP layer(s)" in refused.value.what and "model.mtp_layers.0." in refused.value.what
    assert "save the checkpoint with its MTP layers" in refused.value.fix
    save_file({**trunk, "model.mtp_layers.0.input_proj.weight": torch.zeros(32, 64)}, tmp_path / "model.safetensors")
    assert describe(tmp_path).mtp_head is not None
