"""Target checkpoints a sync cannot use are refused by the loader with the path and the fix, before any state
is read from them: a config of another architecture, a real checkpoint of a family draftsync does not train for,
a config with more layers than the weights, a tokenizer larger than the vocabulary, and code that runs only when
DRAFTSYNC_TRUST_REMOTE_CODE allows it."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from draftsync.errors import DraftsyncError

REMOTE_MODULE = """
import os
from pathlib import Path

from transformers import LlamaForCausalLM

Path(os.environ["REMOTE_CODE_MARKER"]).write_text("the checkpoint's own code ran")


class RemoteLlamaForCausalLM(LlamaForCausalLM):
    pass
"""


def copy_of(target, tmp_path, name: str):
    copy = tmp_path / name
    shutil.copytree(target, copy)
    return copy


def other_config(kind: str) -> dict:
    from transformers import BertConfig, GPT2Config

    if kind == "gpt2":
        return GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=320).to_dict()
    return BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=320
    ).to_dict()


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_a_config_of_another_architecture_over_llama_weights_is_refused(tiny_target, tmp_path, kind):
    """transformers would build the other architecture with random weights and say nothing; its family is refused
    from the config before any weight is read."""
    from draftsync.speculative.targets import load_target

    target = copy_of(tiny_target, tmp_path, f"{kind}-config")
    (target / "config.json").write_text(json.dumps(other_config(kind)))
    with pytest.raises(DraftsyncError) as error:
        load_target(target)
    assert f"target checkpoint {target} is a {kind}" in error.value.what
    assert "an architecture draftsync does not train drafters for" in error.value.what
    assert "LlamaForCausalLM" in error.value.fix
    assert (tiny_target / "config.json").is_file() and (tiny_target / "model.safetensors").is_file()


def test_a_llama_config_with_more_layers_than_the_weights_is_refused(tiny_target, tmp_path):
    """transformers would fill the layers the files lack with random weights and say nothing."""
    from draftsync.speculative.targets import load_target

    target = copy_of(tiny_target, tmp_path, "more-layers")
    config = json.loads((target / "config.json").read_text())
    config["num_hidden_layers"] += 1
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsyncError) as error:
        load_target(target)
    assert str(target) in error.value.what
    assert "weights do not fit its config.json" in error.value.what
    assert "tensors missing" in error.value.what
    assert "config.json that was saved with these weights" in error.value.fix


def test_a_llama_config_with_other_shapes_than_the_weights_is_refused(tiny_target, tmp_path):
    from draftsync.speculative.targets import load_target

    target = copy_of(tiny_target, tmp_path, "other-shapes")
    config = json.loads((target / "config.json").read_text())
    config["intermediate_size"] = 96
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsyncError) as error:
        load_target(target)
    assert f"target {target} could not be loaded" in error.value.what
    assert "ignore_mismatched_sizes" in error.value.what
    assert error.value.fix == "re-export the checkpoint"


def test_a_real_checkpoint_that_is_not_a_llama_style_decoder_is_refused(tiny_target, tmp_path):
    """A complete GPT-2 loads fine in transformers, but is no family draftsync trains drafters for."""
    from draftsync.speculative.targets import load_target
    from transformers import GPT2Config, GPT2LMHeadModel

    target = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=320)).save_pretrained(target)
    for tokenizer_file in tiny_target.glob("*.json"):
        if tokenizer_file.name != "config.json" and not (target / tokenizer_file.name).exists():
            shutil.copy(tokenizer_file, target)
    with pytest.raises(DraftsyncError) as error:
        load_target(target)
    assert f"target checkpoint {target} is a GPT2LMHeadModel" in error.value.what
    assert "an architecture draftsync does not train drafters for" in error.value.what
    assert "register a checkpoint of a supported family" in error.value.fix


def test_a_tokenizer_with_more_tokens_than_the_vocabulary_is_refused(tiny_target, tmp_path):
    from draftsync.speculative.targets import load_target
    from transformers import AutoTokenizer

    target = copy_of(tiny_target, tmp_path, "wide-tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(target)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(40)])
    tokenizer.save_pretrained(target)
    with pytest.raises(DraftsyncError) as error:
        load_target(target)
    assert f"tokenizer of target {target} has 360 tokens but the model's vocabulary is 320" in error.value.what
    assert "tokenizer the target was trained with" in error.value.fix


@pytest.fixture
def remote_code_target(tiny_target, tmp_path, monkeypatch):
    """The tiny target with an `auto_map` to a modeling file of its own that leaves a marker when it runs."""
    import transformers.dynamic_module_utils as dynamic_modules

    target = copy_of(tiny_target, tmp_path, "remote-code-target")
    config = json.loads((target / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_remote.RemoteLlamaForCausalLM"}
    (target / "config.json").write_text(json.dumps(config))
    (target / "modeling_remote.py").write_text(REMOTE_MODULE)
    marker = tmp_path / "remote-code-ran"
    monkeypatch.setenv("REMOTE_CODE_MARKER", str(marker))
    # transformers copies remote code into its modules cache: keep that cache inside the test's temp dir.
    monkeypatch.setattr(dynamic_modules, "HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("DRAFTSYNC_TRUST_REMOTE_CODE", raising=False)
    return target, marker


def test_a_target_that_needs_remote_code_is_refused_by_default_and_its_code_never_runs(remote_code_target):
    from draftsync.speculative.targets import load_target

    target, marker = remote_code_target
    with pytest.raises(DraftsyncError) as error:
        load_target(target)
    assert f"target {target} needs trust_remote_code" in error.value.what
    assert "DRAFTSYNC_TRUST_REMOTE_CODE=true" in error.value.fix
    assert not marker.exists()


def test_remote_code_loads_only_when_the_setting_allows_it(remote_code_target, monkeypatch):
    from draftsync.speculative.targets import load_target

    target, marker = remote_code_target
    monkeypatch.setenv("DRAFTSYNC_TRUST_REMOTE_CODE", "false")
    with pytest.raises(DraftsyncError, match="needs trust_remote_code"):
        load_target(target)
    assert not marker.exists()

    monkeypatch.setenv("DRAFTSYNC_TRUST_REMOTE_CODE", "true")
    model, tokenizer = load_target(target)
    assert type(model).__name__ == "RemoteLlamaForCausalLM"
    assert marker.read_text() == "the checkpoint's own code ran"
    assert len(tokenizer) <= model.config.vocab_size
    # An explicit argument still wins over the setting.
    with pytest.raises(DraftsyncError, match="needs trust_remote_code"):
        load_target(target, trust_remote_code=False)
