"""The built-in target families (Llama 3, Qwen 3, Qwen 2.5, Mistral; the mixture-of-experts Qwen3-MoE, Mixtral and
gpt-oss) through the ML core, checked against math.

Each family's model is transformers' own class with that family's distinguishing settings (untrained here: the
checks are exact, so weights need not mean anything). What is checked is what breaks on real families: hidden
states read through the model's own forward, drafter shapes and rope read from the config, tied embeddings, the
sliding window, and speculative decoding at T=0 reproducing the target's greedy decoding token for token.
"""

from __future__ import annotations

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.builtin.targets import FAMILY_SHAPES, builtin_recipe, family_config
from draftsync.speculative.data.draft_vocab import build_draft_vocab
from draftsync.speculative.data.hidden_states import capture, default_aux_layer_ids
from draftsync.speculative.engine.decoding import SpeculativeEngine
from draftsync.speculative.families import config_features, target_family
from draftsync.speculative.methods.registry import load_drafter, new_drafter, save_drafter

from tests.support.greedy import greedy_reference

FAMILIES = ("llama3", "qwen3", "qwen2", "mistral", "qwen3_moe", "mixtral", "gpt_oss")
METHODS = ("eagle3", "eagle3.1", "eagle", "medusa")


def _tiny(family: str, seed: int = 0):
    import transformers

    recipe = builtin_recipe(1, "test", family)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(family_config(recipe, eos_token_id=0)).eval()
    return model


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    return request.param, _tiny(request.param)


def test_each_family_is_its_transformers_class_with_its_features(family_model):
    family, model = family_model
    config = model.config.to_dict()
    features = config_features(config)
    assert target_family(config).architecture == type(model).__name__
    assert features["grouped_query_attention"] and features["kv_heads"] == 2
    expected = {
        "llama3": {"tied_embeddings": True, "rope_type": "llama3"},
        "qwen3": {"tied_embeddings": True, "qk_norm": True, "head_dim": 64},
        "qwen2": {"tied_embeddings": True, "qkv_bias": True, "head_dim": 32},
        "mistral": {"tied_embeddings": False, "sliding_window": 64},
        "qwen3_moe": {"tied_embeddings": False, "qk_norm": True, "head_dim": 64},
        "mixtral": {"tied_embeddings": False, "sliding_window": None, "rope_type": "default"},
        # Its window is on every other layer only: no window every layer applies, so none for a drafter.
        "gpt_oss": {
            "tied_embeddings": False,
            "qkv_bias": True,
            "head_dim": 64,
            "sliding_window": None,
            "rope_type": "yarn",
        },
    }[family]
    assert {k: features[k] for k in expected} == expected
    if features["tied_embeddings"]:  # no lm_head tensor of its own: the head is the embedding
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_hidden_states_are_the_model_forwards_own(family_model):
    """Aux state k is the model's own hidden_states[k] (input of layer k); `final` its post-norm last state."""
    _, model = family_model
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    layer_ids = default_aux_layer_ids(model.config.num_hidden_layers)
    states = capture(model, ids, layer_ids)
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    expected_aux = torch.cat([out.hidden_states[k] for k in layer_ids], dim=-1)
    torch.testing.assert_close(states.aux, expected_aux)
    torch.testing.assert_close(states.final, out.hidden_states[-1])
    torch.testing.assert_close(states.logits, out.logits)


def test_drafters_take_shape_rope_and_window_from_the_target_config(family_model, tmp_path):
    family, model = family_model
    drafter = new_drafter("eagle3", model.config, draft_vocab_size=256)
    config = drafter.config
    assert (config.head_dim, config.num_key_value_heads) == (config_features(model.config.to_dict())["head_dim"], 2)
    assert config.rope_theta == model.config.rope_parameters["rope_theta"]
    assert config.rope_parameters()["rope_type"] == model.config.rope_parameters["rope_type"]
    assert config.sliding_window == (64 if family == "mistral" else None)
    # The drafter's rope is transformers' own for that rope type (llama3 scales the low frequencies).
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(model.config)
    positions = torch.arange(300)
    hf_cos, hf_sin = rotary(torch.zeros(1, dtype=torch.float32), positions[None])
    cos, sin = drafter._rope(positions, torch.float32)
    torch.testing.assert_close(cos, hf_cos[0, :, : config.head_dim])
    torch.testing.assert_close(sin, hf_sin[0, :, : config.head_dim])
    # What a sync saves, the reference engine (and vLLM) reads back with the same rope and window.
    counts = torch.arange(model.config.vocab_size, 0, -1)  # the 256 lowest ids are the most frequent
    drafter.set_draft_vocab(*build_draft_vocab(counts, 256))
    drafter.initialise_from_target(model)
    saved = save_drafter(drafter, tmp_path / family, "target", [type(model).__name__], 3)
    loaded = load_drafter(saved)
    assert loaded.config.rope_parameters() == config.rope_parameters()
    assert loaded.config.sliding_window == config.sliding_window


@pytest.mark.parametrize("method", METHODS)
def test_speculation_at_t0_reproduces_greedy_decoding_for_every_family_and_method(family_model, method):
    """Untrained drafters are rejected often: every accept/reject path of the verifier runs, on each family's
    attention (GQA, q/k norm, biases, llama3 rope, a 64-token window that 90 tokens cross)."""
    family, model = family_model
    torch.manual_seed(3)
    options = {"num_heads": 3} if method == "medusa" else {}
    drafter = new_drafter(method, model.config, **options).eval()
    drafter.initialise_from_target(model)
    prompt = torch.randint(0, model.config.vocab_size, (20,), generator=torch.Generator().manual_seed(4)).tolist()
    expected = greedy_reference(model, prompt, 90)
    generation = SpeculativeEngine(model, drafter, 3).generate(prompt, 90)
    assert generation.token_ids == expected, (family, method)
    assert generation.stats.drafts > 0


def test_a_drafter_takes_only_a_window_every_target_layer_applies():
    """vLLM windows a draft layer with the target's window only when every target layer has it (not gpt-oss's)."""
    from draftsync.speculative.families import sliding_window_of

    assert sliding_window_of({"sliding_window": 64}) == 64
    assert sliding_window_of({"sliding_window": 64, "layer_types": ["sliding_attention"] * 2}) == 64
    assert sliding_window_of({"sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"]}) is None
    assert sliding_window_of({"sliding_window": 64, "use_sliding_window": False}) is None


def test_the_window_masks_what_the_drafter_sees():
    from draftsync.speculative.methods.eagle3.model import causal_mask, training_time_test_mask

    mask = causal_mask(3, 5, torch.device("cpu"), window=4)
    # New row i stands at position 5 + i and sees positions 5 + i - 3 .. 5 + i.
    assert mask.tolist() == [[c in range(2, 6) for c in range(8)] for _ in [0]] + [
        [c in range(3, 7) for c in range(8)],
        [c in range(4, 8) for c in range(8)],
    ]
    # Training-time test step 1: row t stands at t + 1, so it sees real positions t - 2 .. t of a window of 4.
    ttt = training_time_test_mask(5, 1, torch.device("cpu"), window=4)
    assert ttt[4, :5].tolist() == [False, False, True, True, True]


@pytest.mark.parametrize(
    "extra, refused",
    [
        ({"num_local_experts": 8}, "mixture-of-experts"),
        ({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe"}, "mixture-of-experts"),
        ({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "n_routed_experts": 256}, "experts"),
        ({"vision_config": {}, "architectures": ["LlavaForConditionalGeneration"]}, "multimodal"),
        ({"is_encoder_decoder": True, "architectures": ["T5ForConditionalGeneration"]}, "encoder-decoder"),
        ({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox"}, "does not train drafters for"),
    ],
)
def test_unsupported_checkpoints_are_refused_with_the_nearest_path(extra, refused):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **extra}
    with pytest.raises(DraftsyncError, match=refused) as caught:
        target_family(config, "target demo v3")
    assert "target demo v3" in caught.value.what and caught.value.fix


def test_every_built_in_family_is_a_supported_one():
    from draftsync.speculative.target_description import describe_config

    for family in FAMILY_SHAPES:
        config = family_config(builtin_recipe(1, "test", family), 0).to_dict()
        if config.get("num_nextn_predict_layers"):  # a Qwen 2 trunk that ships its own MTP head
            described = describe_config(config, family, f"target {family}")
            assert described.unsupported is None and described.mtp_head.layout.family == family
            assert target_family(config).name == "qwen2"
            continue
        assert target_family(config).name in ("llama", family)


def test_the_moe_families_are_recognised_and_other_moe_models_are_refused_naming_them():
    for family in ("qwen3_moe", "mixtral", "gpt_oss"):
        config = family_config(builtin_recipe(1, "test", family), 0).to_dict()
        assert target_family(config).name == family and target_family(config).moe
    assert target_family({"architectures": ["MixtralForCausalLM"], "num_local_experts": 8}).name == "mixtral"
    assert target_family({"model_type": "qwen3_moe", "num_experts": 128}).name == "qwen3_moe"
    assert target_family({"architectures": ["GptOssForCausalLM"], "num_local_experts": 32}).name == "gpt_oss"
    with pytest.raises(DraftsyncError) as caught:
        target_family({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_experts": 60})
    what = caught.value.what
    assert "Qwen2MoeForCausalLM" in what and "qwen3_moe (Qwen3MoeForCausalLM)" in what and "mixtral (Mixtral" in what
    assert "dense model" in caught.value.fix and "ngram" in caught.value.fix
