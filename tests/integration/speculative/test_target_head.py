"""A training rank that reads stored states loads only the target's head (embedding, final norm, lm_head), with the
whole target's fingerprint taken from its files: the same tensors and the same fingerprint as loading it whole and
dropping its layers, for each family's way of storing them (tied or untied embeddings, one file or shards)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from draftsync.speculative.targets import load_target, load_target_head, target_fingerprint, without_decoder_layers

SHAPE = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3}
SHAPE |= {"num_attention_heads": 4, "max_position_embeddings": 128}
FAMILIES = {
    "llama": ("LlamaConfig", {}),
    "qwen3 (tied)": ("Qwen3Config", {"num_key_value_heads": 2, "head_dim": 32, "tie_word_embeddings": True}),
    "qwen2 (tied)": ("Qwen2Config", {"num_key_value_heads": 2, "tie_word_embeddings": True}),
    "mistral": ("MistralConfig", {"num_key_value_heads": 2, "sliding_window": 32}),
}


def random_checkpoint(directory: Path, family: str, max_shard_size: str = "5GB") -> Path:
    """A random-weight checkpoint of `family`, saved in fp32 as save_pretrained saves it."""
    import transformers
    from transformers import AutoModelForCausalLM

    class_name, settings = FAMILIES[family]
    config = getattr(transformers, class_name)(**SHAPE, **settings)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory, max_shard_size=max_shard_size)
    return directory


def whole_without_layers(directory: Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return without_decoder_layers(AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval())


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_head_and_the_fingerprint_are_those_of_the_whole_target(tmp_path, family, dtype):
    directory = random_checkpoint(tmp_path / "target", family)
    whole = whole_without_layers(directory, dtype)
    head = load_target_head(directory, {"dtype": dtype})
    assert target_fingerprint(head) == target_fingerprint(whole)
    assert len(head.model.layers) == 0 and head.config.num_hidden_layers == SHAPE["num_hidden_layers"]
    got, expected = head.state_dict(), whole.state_dict()
    assert list(got) == list(expected)
    assert all(torch.equal(got[name], expected[name]) for name in expected)
    if FAMILIES[family][1].get("tie_word_embeddings"):
        assert head.lm_head.weight.data_ptr() == head.model.embed_tokens.weight.data_ptr()


def test_a_sharded_checkpoint_is_read_through_its_index(tmp_path):
    directory = random_checkpoint(tmp_path / "target", "llama", max_shard_size="50KB")
    assert (directory / "model.safetensors.index.json").is_file() and len(list(directory.glob("*.safetensors"))) > 2
    head = load_target_head(directory)
    assert target_fingerprint(head) == target_fingerprint(whole_without_layers(directory, torch.float32))


def test_another_target_gets_another_fingerprint(tmp_path):
    """The check the fingerprint is for: stored states of one target are refused for another."""
    first = load_target_head(random_checkpoint(tmp_path / "a", "llama"))
    other = random_checkpoint(tmp_path / "b", "llama")
    from safetensors.torch import load_file, save_file

    tensors = load_file(other / "model.safetensors")
    tensors["model.layers.2.mlp.up_proj.weight"][0, 0] += 1.0  # a layer the head loader never loads
    save_file(tensors, other / "model.safetensors", metadata={"format": "pt"})
    assert target_fingerprint(load_target_head(other)) != target_fingerprint(first)


def test_files_that_name_tensors_otherwise_are_loaded_whole(tmp_path, built_targets):
    """A checkpoint saved from the bare decoder (no `model.` prefix, tied head) is one transformers still loads; its
    head cannot be read by name, so the target is loaded whole and its layers dropped."""
    from safetensors.torch import load_file, save_file

    directory = tmp_path / "bare"
    shutil.copytree(built_targets[1], directory)
    config_file = directory / "config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"tie_word_embeddings": True}))
    tensors = load_file(directory / "model.safetensors")
    tensors.pop("lm_head.weight", None)
    save_file({name.removeprefix("model."): t for name, t in tensors.items()}, directory / "model.safetensors")
    whole, _ = load_target(directory)
    head = load_target_head(directory)
    assert len(head.model.layers) == 0
    assert target_fingerprint(head) == target_fingerprint(without_decoder_layers(whole))
