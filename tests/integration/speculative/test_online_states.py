"""Online hidden states: a tokens-only dataset whose states the target computes per batch gives the batches an offline
build stores (up to its 16-bit rounding), trains the same drafter, and writes a few bytes a token."""

from __future__ import annotations

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.data.online_states import OnlineDataset, open_dataset
from draftsync.speculative.data.shard_reader import ShardDataset
from draftsync.speculative.train.config import TrainConfig
from draftsync.speculative.train.training import fit_drafter

from tests.support.speculative_fixtures import chain_shards_of, one_torch_thread


@pytest.fixture(scope="module")
def online_dir(target, chain_data, tmp_path_factory):
    from draftsync.speculative.data.samples import Sample
    from draftsync.speculative.data.shard_writer import build_shards

    out = tmp_path_factory.mktemp("online")
    samples = [Sample("chain", list(s), [1] * len(s)) for s in chain_data]
    with one_torch_thread():
        build_shards(target, samples, out, (1, 2, 3), shard_tokens=4096, batch_size=32, online=True)
    return out


def test_online_batches_are_the_stored_batches(target, chain_shards, online_dir):
    online = OnlineDataset(online_dir, target)
    assert not online.stores_states and chain_shards.stores_states
    assert online.num_sequences == chain_shards.num_sequences
    windows = chain_shards.windows(list(range(chain_shards.num_sequences)), 24)  # several windows a sequence
    picked = windows[torch.randperm(windows.shape[0], generator=torch.Generator().manual_seed(0))[:12]]
    assert (picked[:, 1] > 0).any()  # windows that start mid-sequence: their states need the tokens before them
    stored, computed = chain_shards.batch(picked, 24), online.batch(picked, 24)
    assert torch.equal(stored.ids, computed.ids) and torch.equal(stored.loss_mask, computed.loss_mask)
    for name in ("final", "aux"):
        a, b = getattr(stored, name), getattr(computed, name)
        assert torch.allclose(a, b, rtol=1e-2, atol=1e-2), (name, (a - b).abs().max())  # bf16 on disk


def test_a_drafter_trained_online_learns_what_the_offline_one_learns(target, chain_shards, online_dir):
    config = TrainConfig(draft_vocab_size=256, steps=40, batch_size=8, seq_len=32, ttt_steps=2, seed=0)
    with one_torch_thread():
        _, offline = fit_drafter(target, chain_shards, config)
        _, online = fit_drafter(target, OnlineDataset(online_dir, target), config)
    assert online.losses == pytest.approx(offline.losses, rel=2e-2)
    assert abs(online.top1_agreement - offline.top1_agreement) <= 0.03


def test_the_tokens_only_dataset_is_a_few_bytes_a_token(chain_shards, online_dir):
    def size(directory):
        return sum(f.stat().st_size for f in directory.glob("shard-*.safetensors"))

    tokens = chain_shards.manifest["total_tokens"]
    assert size(online_dir) < 7 * tokens < size(chain_shards.path) / 10


def test_reading_a_tokens_only_dataset_without_its_target_says_how(online_dir, target):
    plain = ShardDataset(online_dir)
    with pytest.raises(DraftsyncError, match="holds tokens only"):
        plain.batch(plain.windows([0], 16))
    assert isinstance(open_dataset(online_dir, target), OnlineDataset)
    assert summary_nonfinite(plain) == 0


def summary_nonfinite(dataset) -> int:
    return sum(row["nonfinite"] for row in dataset.summary_rows())


def test_a_build_cannot_resume_into_the_other_kind(target, chain_data, tmp_path):
    with one_torch_thread():
        chain_shards_of(target, chain_data[:8], tmp_path / "stored")
    from draftsync.speculative.data.samples import Sample
    from draftsync.speculative.data.shard_writer import build_shards

    samples = [Sample("chain", list(s), [1] * len(s)) for s in chain_data[:8]]
    with pytest.raises(DraftsyncError, match="states='stored'"):
        build_shards(target, samples, tmp_path / "stored", (1, 2, 3), online=True)
