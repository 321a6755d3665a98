"""MTP heads on disk: the directory vLLM's `mtp` method loads, and the head a MiMo target's checkpoint ships."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.engine.decoding import SpeculativeEngine
from draftsync.speculative.methods.mtp.checkpoint import read_shipped_mtp
from draftsync.speculative.methods.mtp.model import MtpHead
from draftsync.speculative.methods.registry import (
    check_drafter_fits_target,
    drafter_method,
    load_drafter,
    new_drafter,
    save_drafter,
)
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

VOCAB = 128
HIDDEN = 64
LAYERS = 2
MIMO = ["MiMoForCausalLM"]
LAYER = "model.mtp_layers.0."
# The tensors vLLM's MiMoMTP loads from the directory its speculative config names, with their shapes.
VLLM_NAMES = {
    "model.embed_tokens.weight": (VOCAB, HIDDEN),
    "lm_head.weight": (VOCAB, HIDDEN),
    LAYER + "token_layernorm.weight": (HIDDEN,),
    LAYER + "hidden_layernorm.weight": (HIDDEN,),
    LAYER + "input_proj.weight": (HIDDEN, 2 * HIDDEN),
    LAYER + "input_layernorm.weight": (HIDDEN,),
    LAYER + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
    LAYER + "self_attn.q_proj.bias": (HIDDEN,),
    LAYER + "self_attn.k_proj.weight": (32, HIDDEN),
    LAYER + "self_attn.k_proj.bias": (32,),
    LAYER + "self_attn.v_proj.weight": (32, HIDDEN),
    LAYER + "self_attn.v_proj.bias": (32,),
    LAYER + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
    LAYER + "post_attention_layernorm.weight": (HIDDEN,),
    LAYER + "mlp.gate_proj.weight": (128, HIDDEN),
    LAYER + "mlp.up_proj.weight": (128, HIDDEN),
    LAYER + "mlp.down_proj.weight": (HIDDEN, 128),
    LAYER + "final_layernorm.weight": (HIDDEN,),
}


def qwen2_target(tied: bool = False, vocab: int = VOCAB) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        tie_word_embeddings=tied,
    )
    return Qwen2ForCausalLM(config).eval()


def mtp_for(target) -> MtpHead:
    torch.manual_seed(1)
    head = new_drafter("mtp", target.config)
    head.initialise_from_target(target)
    with torch.no_grad():  # non-trivial norms and biases, so that a lost one shows
        for name, parameter in head.model.mtp_layers.named_parameters():
            if name.endswith("bias") or "norm" in name:
                parameter.add_(0.2 * torch.randn(parameter.shape))
    return head.eval()


def bf16_rounded(head: MtpHead) -> MtpHead:
    """The head as its bf16 checkpoint keeps it."""
    copy = MtpHead(head.config)
    copy.load_state_dict({name: t.to(torch.bfloat16).float() for name, t in head.state_dict().items()})
    return copy.eval()


def mimo_checkpoint(directory: Path, head: MtpHead | None, target, drop: tuple[str, ...] = ()) -> Path:
    """`target` saved as a MiMo checkpoint (sharded, with its weight index) whose config declares one MTP layer and
    whose weights carry `head`'s layer under model.mtp_layers.0.* (none without a head; `drop` leaves some out)."""
    target.save_pretrained(directory, max_shard_size="100KB")
    config = json.loads((directory / "config.json").read_text())
    config.update(architectures=MIMO, model_type="mimo", num_nextn_predict_layers=1)
    (directory / "config.json").write_text(json.dumps(config))
    index_file = directory / "model.safetensors.index.json"
    assert index_file.is_file()  # a sharded checkpoint: the reader follows its index
    if head is not None:
        layer = {name: t.clone() for name, t in head.state_dict().items() if "mtp_layers" in name and name not in drop}
        save_file(layer, str(directory / "model-mtp.safetensors"))
        index = json.loads(index_file.read_text())
        index["weight_map"].update(dict.fromkeys(layer, "model-mtp.safetensors"))
        index_file.write_text(json.dumps(index))
    return directory


# ---- the directory draftsync saves -------------------------------------------------------------------
def test_a_saved_head_holds_exactly_vllms_tensors_and_a_mimo_config(tmp_path):
    target = qwen2_target()
    out = save_drafter(mtp_for(target), tmp_path / "mtp", "/models/mimo-7b", MIMO, 3)
    assert sorted(path.name for path in out.iterdir()) == ["config.json", "model.safetensors"]
    weights = load_file(str(out / "model.safetensors"))
    assert {name: tuple(t.shape) for name, t in weights.items()} == VLLM_NAMES
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == MIMO and config["num_nextn_predict_layers"] == 1
    assert config["model_type"] == target.config.model_type == "qwen2"
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (LAYERS, HIDDEN, VOCAB)
    assert config["rope_parameters"]["rope_theta"] == 50000.0 and config["rope_theta"] == 50000.0
    assert config["draftsync_drafter"] == "mtp" and config["draftsync_speculative_tokens"] == 3
    loaded = AutoConfig.from_pretrained(out)  # what vLLM reads it with: a Qwen2 config with one MTP layer
    assert type(loaded).__name__ == "Qwen2Config" and loaded.num_nextn_predict_layers == 1
    assert loaded.num_attention_heads == 4 and loaded.num_key_value_heads == 2 and loaded.intermediate_size == 128


def test_a_saved_head_loads_back_and_drafts_as_before(tmp_path):
    target = qwen2_target()
    head = mtp_for(target)
    out = save_drafter(head, tmp_path / "mtp", "/models/mimo-7b", MIMO, 3)
    assert drafter_method(out) == "mtp"
    loaded = load_drafter(out)
    assert type(loaded) is MtpHead and loaded.aux_layer_ids == (LAYERS,)
    reference = bf16_rounded(head)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert not loaded.model.embed_tokens.weight.requires_grad and not loaded.lm_head.weight.requires_grad
    check_drafter_fits_target(out, save_target(target, tmp_path / "target"))
    with pytest.raises(DraftsyncError, match="vocabulary of 128"):
        check_drafter_fits_target(out, save_target(qwen2_target(vocab=160), tmp_path / "other"))
    prompt = [4, 9, 33, 2]
    plain = SpeculativeEngine(target, None, 0).generate(prompt, 20)
    assert SpeculativeEngine(target, loaded, 2).generate(prompt, 20).token_ids == plain.token_ids


def save_target(target, directory: Path) -> Path:
    target.save_pretrained(directory)
    return directory


def test_a_head_for_a_target_vllm_feeds_no_pre_norm_state_is_not_saved(tmp_path):
    with pytest.raises(DraftsyncError, match="MiMoForCausalLM") as error:
        save_drafter(mtp_for(qwen2_target()), tmp_path / "mtp", "/models/qwen2", ["Qwen2ForCausalLM"], 3)
    assert "num_nextn_predict_layers" in error.value.fix
    assert not (tmp_path / "mtp").exists()


# ---- the head a target ships -------------------------------------------------------------------------
def test_the_head_a_mimo_checkpoint_ships_is_read_from_its_weights(tmp_path):
    target = qwen2_target()
    shipped = mtp_for(target)
    directory = mimo_checkpoint(tmp_path / "mimo", shipped, target)
    head = read_shipped_mtp(directory)
    for name, tensor in shipped.state_dict().items():
        assert torch.equal(head.state_dict()[name], tensor), name
    assert head.config.rope_theta == 50000.0 and head.aux_layer_ids == (LAYERS,)
    # vLLM serves it from the target's own directory; draftsync reads it there too
    assert drafter_method(directory) == "mtp"
    assert torch.equal(
        load_drafter(directory).state_dict()[LAYER + "input_proj.weight"], shipped.layer.input_proj.weight
    )


def test_a_tied_target_lends_its_embedding_as_the_heads_lm_head(tmp_path):
    target = qwen2_target(tied=True)
    directory = mimo_checkpoint(tmp_path / "tied", mtp_for(target), target)
    assert "lm_head.weight" not in json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    head = read_shipped_mtp(directory)
    assert torch.equal(head.lm_head.weight, target.model.embed_tokens.weight)


def test_a_config_declaring_mtp_layers_its_weights_lack_is_refused_with_the_missing_names(tmp_path):
    target = qwen2_target()
    directory = mimo_checkpoint(tmp_path / "none", None, target)
    with pytest.raises(DraftsyncError, match="declares 1 MTP layer") as error:
        read_shipped_mtp(directory)
    assert f"{LAYER}input_proj.weight" in error.value.what and f"{LAYER}final_layernorm.weight" in error.value.what
    assert "num_nextn_predict_layers to 0" in error.value.fix and "model.mtp_layers" in error.value.fix
    partial = mimo_checkpoint(tmp_path / "partial", mtp_for(target), target, drop=(LAYER + "self_attn.k_proj.bias",))
    with pytest.raises(
        DraftsyncError, match="lack 1 of the MTP head's tensors: model.mtp_layers.0.self_attn.k_proj.bias"
    ):
        load_drafter(partial)


def test_a_target_without_mtp_layers_is_no_mtp_drafter(tmp_path):
    target = qwen2_target()
    plain = save_target(target, tmp_path / "qwen2")
    with pytest.raises(DraftsyncError, match="declares no MTP layers"):
        read_shipped_mtp(plain)
    with pytest.raises(DraftsyncError, match="not the config of a drafter"):
        drafter_method(plain)
    # another family's head (DeepSeek-V3 keeps it as decoder layer n) is not read as a MiMo one
    config = json.loads((plain / "config.json").read_text())
    config.update(architectures=["DeepseekV3ForCausalLM"], num_nextn_predict_layers=1)
    (plain / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsyncError, match="another family's layout"):
        read_shipped_mtp(plain)
