"""Fixtures of the real-vLLM tests: one briefly trained drafter of each family vLLM serves, shared by the session."""

from __future__ import annotations

from pathlib import Path

import pytest

FAMILIES = ("eagle3", "eagle3.1", "eagle", "medusa")
MAX_GAMMA = 3  # the largest gamma these tests serve; Medusa drafters get this many heads


@pytest.fixture(scope="session")
def family_drafters(built_targets, tmp_path_factory) -> dict[str, Path]:
    """One briefly trained drafter per family for target v1, saved as a sync saves it."""
    return train_drafters(built_targets[1], tmp_path_factory.mktemp("families"))


def train_drafters(target_dir: Path, root: Path, methods: tuple[str, ...] = FAMILIES) -> dict[str, Path]:
    """One briefly trained drafter of each method for the target at `target_dir`, saved under `root` as a sync
    saves it: shards of teacher-forced corpus text and the target's own answers, then 120 steps each."""
    import torch
    from draftsync.speculative.corpora import mixed_texts, task_prompts_for_mix
    from draftsync.speculative.drafters import save_drafter
    from draftsync.speculative.hidden_states import default_aux_layer_ids, num_decoder_layers
    from draftsync.speculative.samples import concat_samples, regenerated_samples, teacher_forced_samples
    from draftsync.speculative.shard_reader import ShardDataset
    from draftsync.speculative.shard_writer import build_shards
    from draftsync.speculative.targets import load_target
    from draftsync.speculative.training import TrainConfig, train_drafter

    model, tokenizer = load_target(target_dir)
    mix = {"code": 0.5, "math": 0.5}
    samples = concat_samples(
        teacher_forced_samples(tokenizer, mixed_texts(mix, 120, seed=3)),
        regenerated_samples(model, tokenizer, task_prompts_for_mix(mix, 48, seed=4, split="train"), 48, seed=5),
    )
    build_shards(model, samples, root / "shards", default_aux_layer_ids(num_decoder_layers(model)), store_aux=True)
    dataset = ShardDataset(root / "shards")
    drafters = {}
    for method in methods:
        torch.manual_seed(0)
        config = TrainConfig(
            method=method,
            steps=120,
            batch_size=8,
            seq_len=96,
            lr=5e-3,
            medusa_heads=MAX_GAMMA,
            draft_vocab_size=None if method == "eagle" else 512,
        )
        drafter, _ = train_drafter(model, dataset, config)
        drafters[method] = save_drafter(
            drafter, root / method, str(target_dir), list(model.config.architectures), MAX_GAMMA
        )
    return drafters
