"""The built-in targets' chat template: every shipped folder and a fresh build carry it where transformers'
AutoTokenizer (and so vLLM's /v1/chat/completions) reads it, and a cached build made before it existed is given it."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

import pytest
from draftsync.speculative.builtin.shipped_targets import SHIPPED, SHIPPED_DIR, shipped_name, verify
from draftsync.speculative.builtin.targets import build_target, builtin_recipe
from draftsync.speculative.builtin.tokenizer import CHAT_TEMPLATE, CHAT_TEMPLATE_FILE, EOS
from draftsync.speculative.targets import TARGET_INFO_FILE
from transformers import AutoTokenizer

CONVERSATION = [
    {"role": "user", "content": "What is 6 times 7?"},
    {"role": "assistant", "content": "6 * 7 = 42."},
    {"role": "user", "content": "And 2 + 2?"},
]
RENDERED = f"User: What is 6 times 7?\nAssistant: 6 * 7 = 42.\n{EOS}User: And 2 + 2?\nAssistant:"


def _renders_the_conversation(folder: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer.chat_template == CHAT_TEMPLATE
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert text == RENDERED
    assert tokenizer.apply_chat_template(CONVERSATION, tokenize=False) == RENDERED.removesuffix("Assistant:")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.eos_token_id) == 1  # the assistant turn's end is the one special token, EOS
    # no character fell outside the vocabulary (a Qwen 2 tokenizer's unknown token is its EOS, counted above)
    assert tokenizer.unk_token_id in (None, tokenizer.eos_token_id) or tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text  # byte-level: every character of the template round-trips


@pytest.mark.parametrize("size,family,version", SHIPPED, ids=[shipped_name(*s) for s in SHIPPED])
def test_every_shipped_target_renders_a_conversation_with_its_generation_prompt(size, family, version):
    folder = SHIPPED_DIR / shipped_name(size, family, version)
    assert CHAT_TEMPLATE_FILE in verify(folder)["files"]  # recorded in the manifest, so a copy carries it
    _renders_the_conversation(folder)


def test_a_freshly_built_target_renders_a_conversation(tmp_path):
    """Trained here, not copied (a short test-size recipe no shipped folder has): its tokenizer saves the template,
    also when the tokenizer it starts from was cached before the template existed."""
    recipe = dataclasses.replace(builtin_recipe(1, "test"), steps=2)
    built = build_target(recipe, tmp_path, use_shipped=False)
    assert (built / CHAT_TEMPLATE_FILE).read_text() == CHAT_TEMPLATE
    _renders_the_conversation(built)

    (cached_tokenizer,) = tmp_path.glob("tokenizer-*")
    (cached_tokenizer / CHAT_TEMPLATE_FILE).unlink()
    again = build_target(dataclasses.replace(recipe, steps=1), tmp_path, use_shipped=False)
    assert again != built and (again / CHAT_TEMPLATE_FILE).read_text() == CHAT_TEMPLATE


def test_a_cache_built_before_the_template_gets_it_and_keeps_its_weights(tmp_path):
    """A work dir's cache made before the template existed: the cached target (copied from the shipped folder then)
    and the cached tokenizer a new build starts from both lack it; build_target gives it back, weights untouched."""
    recipe = builtin_recipe(1, "test")
    cached = tmp_path / f"target-{recipe.key()}"
    shutil.copytree(SHIPPED_DIR / shipped_name("test", "llama", 1), cached)
    (cached / "shipped.json").unlink()
    (cached / CHAT_TEMPLATE_FILE).unlink()
    weights = hashlib.sha256((cached / "model.safetensors").read_bytes()).hexdigest()

    assert build_target(recipe, tmp_path) == cached
    assert (cached / CHAT_TEMPLATE_FILE).read_text() == CHAT_TEMPLATE
    assert hashlib.sha256((cached / "model.safetensors").read_bytes()).hexdigest() == weights
    assert (cached / TARGET_INFO_FILE).exists()
    _renders_the_conversation(cached)
