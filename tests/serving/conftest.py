"""A tiny random-init HF Llama target with a byte-level BPE tokenizer, saved like any real checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The sum of 12 and 30 is 42. Then 42 minus 2 is 40.",
    "Permission is hereby granted, free of charge, to any person obtaining a copy.",
] * 20


def build_tiny_target(directory: Path, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftsync.speculative.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(TEXTS, vocab_size=320, out_dir=directory)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=96, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id, tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    return build_tiny_target(tmp_path_factory.mktemp("tiny-target"))
