"""Tiny random-init checkpoints for serving tests: an HF Llama target with a byte-level BPE tokenizer
and an EAGLE-3 drafter in the speculators format, saved like real ones."""

from __future__ import annotations

from pathlib import Path

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The sum of 12 and 30 is 42. Then 42 minus 2 is 40.",
    "Permission is hereby granted, free of charge, to any person obtaining a copy.",
] * 20


def build_tiny_target(directory: Path, seed: int = 0, hidden_size: int = 32) -> Path:
    import torch
    from draftsync.speculative.builtin.tokenizer import train_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = train_tokenizer(TEXTS, vocab_size=320, out_dir=directory)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=320,
        hidden_size=hidden_size,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=96,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def build_tiny_drafter(target_dir: Path, directory: Path, gamma: int, seed: int = 0) -> Path:
    """A random EAGLE-3 drafter for the tiny target, started from the target's embeddings and head."""
    import torch
    from draftsync.speculative.methods.checkpoint_files import SavedFor
    from draftsync.speculative.methods.eagle3.checkpoint import save_eagle3
    from draftsync.speculative.methods.eagle3.model import Eagle3Config, Eagle3Drafter
    from draftsync.speculative.targets import load_target

    target, _ = load_target(target_dir)
    torch.manual_seed(seed)
    drafter = Eagle3Drafter(Eagle3Config.for_target(target.config))
    drafter.initialise_from_target(target)
    return save_eagle3(drafter, directory, SavedFor(str(target_dir), tuple(target.config.architectures), gamma))


def build_tiny_dflash(target_dir: Path, directory: Path, gamma: int = 3, **config_changes) -> Path:
    """A random DFlash drafter of block 4 (up to 3 draft tokens) for the tiny target, built for its config with
    `config_changes` (e.g. another hidden_size: a drafter of another target)."""
    import torch
    from draftsync.speculative.methods.registry import new_drafter, save_drafter
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(target_dir)
    for key, value in config_changes.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    aux = tuple(range(1, min(3, config.num_hidden_layers) + 1))  # decoder layer outputs, up to three of them
    drafter = new_drafter("dflash", config, None, aux, block_size=4)
    return save_drafter(drafter, directory, str(target_dir), list(config.architectures or ["LlamaForCausalLM"]), gamma)
