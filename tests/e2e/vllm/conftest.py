"""Fixtures of the real-vLLM tests: one briefly trained drafter of each family vLLM serves, shared by the session
and trained when a test first asks for it (the smoke tier needs EAGLE-3's and DFlash's only)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

FAMILIES = ("eagle3", "eagle3.1", "eagle", "medusa", "dflash", "peagle")
MAX_GAMMA = 3  # the largest gamma these tests serve; Medusa drafters get this many heads


@pytest.fixture(scope="session")
def family_drafters(built_targets, tmp_path_factory) -> Mapping[str, Path]:
    """One briefly trained drafter per family for target v1, saved as a sync saves it, trained on first use."""
    return FamilyDrafters(built_targets[1], tmp_path_factory.mktemp("families"))


class FamilyDrafters(Mapping[str, Path]):
    """The drafters of `methods` for the target at `target_dir`, under `root` as a sync saves them: shards of
    teacher-forced corpus text and the target's own answers (built once), then 120 steps each, a method's drafter
    trained when it is first looked up."""

    def __init__(self, target_dir: Path, root: Path, methods: tuple[str, ...] = FAMILIES):
        self.target_dir, self.root, self.methods = target_dir, root, methods
        self._trained: dict[str, Path] = {}
        self._loaded = None

    def __iter__(self) -> Iterator[str]:
        return iter(self.methods)

    def __len__(self) -> int:
        return len(self.methods)

    def __getitem__(self, method: str) -> Path:
        if method not in self.methods:
            raise KeyError(method)
        if method not in self._trained:
            self._trained[method] = self._train(method)
        return self._trained[method]

    def _target_and_data(self):
        from draftsync.speculative.data.corpora import mixed_texts, task_prompts_for_mix
        from draftsync.speculative.data.hidden_states import default_aux_layer_ids, num_decoder_layers
        from draftsync.speculative.data.samples import concat_samples, regenerated_samples, teacher_forced_samples
        from draftsync.speculative.data.shard_reader import ShardDataset
        from draftsync.speculative.data.shard_writer import build_shards
        from draftsync.speculative.targets import load_target

        if self._loaded is None:
            model, tokenizer = load_target(self.target_dir)
            mix = {"code": 0.5, "math": 0.5}
            samples = concat_samples(
                teacher_forced_samples(tokenizer, mixed_texts(mix, 120, seed=3)),
                regenerated_samples(model, tokenizer, task_prompts_for_mix(mix, 48, seed=4, split="train"), 48, seed=5),
            )
            shards = self.root / "shards"
            build_shards(model, samples, shards, default_aux_layer_ids(num_decoder_layers(model)), store_aux=True)
            self._loaded = (model, ShardDataset(shards))
        return self._loaded

    def _train(self, method: str) -> Path:
        import torch
        from draftsync.speculative.methods import METHODS
        from draftsync.speculative.methods.registry import save_drafter
        from draftsync.speculative.train.config import TrainConfig
        from draftsync.speculative.train.training import fit_drafter

        model, dataset = self._target_and_data()
        torch.manual_seed(0)
        config = TrainConfig(
            method=method,
            steps=120,
            batch_size=8,
            seq_len=96,
            lr=5e-3,
            medusa_heads=MAX_GAMMA,
            draft_vocab_size=None if METHODS[method].full_vocabulary else 512,
        )
        drafter, _ = fit_drafter(model, dataset, config)
        return save_drafter(
            drafter, self.root / method, str(self.target_dir), list(model.config.architectures), MAX_GAMMA
        )
