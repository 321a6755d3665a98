"""Hidden-state shards: what is stored equals what the target computes, builds resume exactly, reads are
deterministic."""

from __future__ import annotations

import json

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.files import is_temp_file
from draftsync.speculative.data.hidden_states import capture
from draftsync.speculative.data.samples import Sample, concat_samples, regenerated_samples, teacher_forced_samples
from draftsync.speculative.data.shard_manifest import MANIFEST_FILE
from draftsync.speculative.data.shard_reader import ShardDataset
from draftsync.speculative.data.shard_writer import _length_groups, build_shards
from safetensors.torch import load_file

from tests.support.killed_writer import killed_mid_write

LAYERS = (1, 2, 4)
TASKS = ("code", "math", "prose")


def make_samples(chains, count: int = 30) -> list[Sample]:
    """Sequences of varied lengths (5..60) over three tasks, loss on all but the first few tokens."""
    out = []
    for i, chain in enumerate(chains[:count]):
        length = 5 + (i * 7) % 56
        ids = chain[:length]
        out.append(Sample(TASKS[i % 3], ids, [0] * min(2, length - 2) + [1] * (length - min(2, length - 2))))
    return out


@pytest.fixture(scope="module")
def samples(make_chains):
    return make_samples(make_chains(40, 64, seed=3))


@pytest.fixture(scope="module")
def built(tmp_path_factory, random_target, samples):
    out = tmp_path_factory.mktemp("shards")
    manifest = build_shards(random_target, samples, out, LAYERS, shard_tokens=200, batch_size=4)
    return out, manifest


def shard_tensors(directory) -> dict[str, dict[str, torch.Tensor]]:
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    out = {}
    for shard in manifest["shards"]:
        out[shard["file"]] = load_file(str(directory / shard["file"]))
    return out


def assert_bf16_close(stored: torch.Tensor, exact: torch.Tensor) -> None:
    """Within bf16 rounding: 8 significant bits, so a relative error of at most 2^-8."""
    torch.testing.assert_close(stored.float(), exact.float(), rtol=2**-8, atol=1e-6)


# ---- what is stored ----------------------------------------------------------------------------------
def test_stored_states_equal_the_targets_states_within_bf16_rounding(built, random_target, samples):
    directory, manifest = built
    data = ShardDataset(directory)
    assert data.num_sequences == len(samples) == manifest["num_sequences"]
    assert len(manifest["shards"]) > 3, "the test data should span several shards"
    for index in (0, 7, len(samples) - 1):
        sample = samples[index]
        exact = capture(random_target, torch.tensor([sample.input_ids]), LAYERS)
        batch = data.batch(data.windows([index], 64))
        length = len(sample.input_ids)
        assert batch.ids[0, :length].tolist() == sample.input_ids
        assert batch.loss_mask[0, :length].tolist() == [bool(m) for m in sample.loss_mask]
        assert not batch.valid[0, length:].any() and batch.target_logits is None
        assert batch.aux.dtype == batch.final.dtype == torch.float32
        assert_bf16_close(batch.aux[0, :length], exact.aux[0])
        assert_bf16_close(batch.final[0, :length], exact.final[0])
        # final is the post-norm state: the target's logits are its lm_head applied to it.
        logits = random_target.lm_head(batch.final[0, :length])
        assert (logits.argmax(-1) == exact.logits[0].argmax(-1)).float().mean() > 0.95


def test_states_on_disk_are_16_bit_and_fp16_can_be_chosen(built, tmp_path, random_target, samples):
    directory, manifest = built
    assert manifest["dtype"] == "bfloat16"
    for tensors in shard_tensors(directory).values():
        assert tensors["aux"].dtype == tensors["final"].dtype == torch.bfloat16
        assert tensors["input_ids"].dtype == torch.int32 and tensors["loss_mask"].dtype == torch.bool
        assert tensors["offsets"].dtype == torch.int64 and tensors["task_index"].dtype == torch.int16
        assert tensors["aux"].shape[1] == 3 * 64 and tensors["final"].shape[1] == 64
    build_shards(random_target, samples[:6], tmp_path, LAYERS, dtype=torch.float16)
    assert {t["final"].dtype for t in shard_tensors(tmp_path).values()} == {torch.float16}
    with pytest.raises(DraftsyncError, match="cannot be stored as torch.float32"):
        build_shards(random_target, samples[:6], tmp_path / "fp32", LAYERS, dtype=torch.float32)


def test_right_padding_does_not_change_the_states_of_real_tokens(random_target, samples):
    short, long = samples[0].input_ids, samples[5].input_ids
    assert len(short) < len(long)
    padded = torch.zeros(2, len(long), dtype=torch.long)
    padded[0, : len(short)] = torch.tensor(short)
    padded[1] = torch.tensor(long)
    together = capture(random_target, padded, LAYERS)
    alone = capture(random_target, torch.tensor([short]), LAYERS)
    torch.testing.assert_close(together.aux[0, : len(short)], alone.aux[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(together.final[0, : len(short)], alone.final[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch_size, max_batch_tokens", [(1, 8192), (8, 64)])
def test_batching_of_the_build_does_not_change_what_is_stored(
    built, tmp_path, random_target, samples, batch_size, max_batch_tokens
):
    directory, _ = built
    manifest = build_shards(
        random_target,
        samples,
        tmp_path,
        LAYERS,
        shard_tokens=10_000,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
    )
    assert (manifest["batch_size"], manifest["max_batch_tokens"]) == (batch_size, max_batch_tokens)
    one_by_one, batched = ShardDataset(tmp_path), ShardDataset(directory)
    windows = one_by_one.windows(range(len(samples)), 64)
    assert torch.equal(windows, batched.windows(range(len(samples)), 64))
    a, b = one_by_one.batch(windows), batched.batch(windows)
    assert torch.equal(a.ids, b.ids) and torch.equal(a.loss_mask, b.loss_mask)
    torch.testing.assert_close(a.aux, b.aux, rtol=2**-7, atol=1e-5)  # at most one bf16 step apart
    torch.testing.assert_close(a.final, b.final, rtol=2**-7, atol=1e-5)


def test_forward_passes_stay_within_the_token_budget():
    lengths = [5, 60, 12, 33, 7, 60, 2, 41]
    groups = _length_groups(lengths, 64)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        assert len(group) == 1 or len(group) * max(lengths[i] for i in group) <= 64
    assert _length_groups(lengths, 10_000, spread=100) == [[6, 0, 4, 2, 3, 7, 1, 5]]  # one pass, shortest first


def test_a_forward_pass_does_not_pad_short_sequences_to_long_ones():
    lengths = [5, 60, 12, 33, 7, 60, 2, 41]
    groups = _length_groups(lengths, 10_000)
    for group in groups:
        assert max(lengths[i] for i in group) <= 1.5 * min(lengths[i] for i in group)
    assert groups == [[6], [0, 4], [2], [3, 7], [1, 5]]


def test_manifest_records_the_target_the_tasks_and_loss_token_counts(built, random_target, samples):
    directory, manifest = built
    target = manifest["target"]
    assert (target["hidden_size"], target["num_layers"], target["vocab_size"]) == (64, 4, 384)
    assert manifest["aux_layer_ids"] == list(LAYERS) and manifest["complete"] and manifest["format_version"] == 1
    assert manifest["tasks"] == {
        task: {
            "sequences": sum(s.task == task for s in samples),
            "tokens": sum(len(s.input_ids) for s in samples if s.task == task),
            "loss_tokens": sum(sum(s.loss_mask) for s in samples if s.task == task),
        }
        for task in TASKS
    }
    assert manifest["total_tokens"] == sum(len(s.input_ids) for s in samples)
    expected = torch.zeros(384, dtype=torch.int64)
    for s in samples:
        for token, mask in zip(s.input_ids, s.loss_mask, strict=True):
            expected[token] += mask
    counts = ShardDataset(directory).token_counts()
    assert counts.dtype == torch.int64 and torch.equal(counts, expected)


def test_unusable_samples_are_skipped_and_counted_and_bad_ids_refused(tmp_path, random_target, samples):
    given = [samples[0], Sample("code", [5], [1]), Sample("math", [5, 6, 7], [1, 0, 0]), samples[1]]
    manifest = build_shards(random_target, given, tmp_path / "a", LAYERS)
    assert manifest["num_sequences"] == 2 and manifest["samples_consumed"] == 4
    assert manifest["skipped_samples"] == {"too_short": 1, "no_loss_tokens": 1}
    with pytest.raises(DraftsyncError, match="outside the target vocabulary"):
        build_shards(random_target, [Sample("code", [1, 384], [1, 1])], tmp_path / "b", LAYERS)
    with pytest.raises(DraftsyncError, match="loss mask"):
        build_shards(random_target, [Sample("code", [1, 2, 3], [1, 1])], tmp_path / "c", LAYERS)


def test_without_aux_states_only_final_is_stored(tmp_path, random_target, samples):
    build_shards(random_target, samples[:8], tmp_path, LAYERS, store_aux=False)
    assert all("aux" not in t for t in shard_tensors(tmp_path).values())
    data = ShardDataset(tmp_path)
    batch = data.batch(data.windows(range(8), 32))
    assert batch.aux is None and batch.final.shape[-1] == 64
    assert {row["aux_width"] for row in data.summary_rows()} == {0}


# ---- resuming ----------------------------------------------------------------------------------------
def interrupted(samples, after: int):
    for index, sample in enumerate(samples):
        if index == after:
            raise KeyboardInterrupt("stopped")
        yield sample


def test_an_interrupted_build_resumes_to_exactly_the_uninterrupted_result(built, tmp_path, random_target, samples):
    directory, manifest = built
    with pytest.raises(KeyboardInterrupt):
        build_shards(random_target, interrupted(samples, 23), tmp_path, LAYERS, shard_tokens=200, batch_size=4)
    partial = json.loads((tmp_path / MANIFEST_FILE).read_text())
    assert not partial["complete"] and 0 < partial["samples_consumed"] < 23
    assert partial["samples_consumed"] % 4 == 0  # shards close on batch boundaries
    with pytest.raises(DraftsyncError, match="incomplete"):
        ShardDataset(tmp_path)
    # A shard written after the last manifest update (killed before committing) is discarded on resume, and so
    # is what a writer killed mid-write leaves; the manifest it was writing stays the last committed one.
    next_shard = tmp_path / f"shard-{len(partial['shards']):05d}.safetensors"
    next_shard.write_bytes(b"half a shard")
    killed_mid_write(tmp_path / MANIFEST_FILE, "{")
    killed_mid_write(tmp_path / f"shard-{len(partial['shards']) + 1:05d}.safetensors", "half a shard")
    assert json.loads((tmp_path / MANIFEST_FILE).read_text()) == partial
    assert sum(is_temp_file(p) for p in tmp_path.iterdir()) == 2

    resumed = build_shards(random_target, samples, tmp_path, LAYERS, shard_tokens=200, batch_size=4)
    assert resumed == manifest
    assert not list(tmp_path.glob("*.tmp"))  # hidden files included
    expected, got = shard_tensors(directory), shard_tensors(tmp_path)
    assert expected.keys() == got.keys()
    for name in expected:
        for key in expected[name]:
            assert torch.equal(expected[name][key], got[name][key]), (name, key)
    assert torch.equal(ShardDataset(tmp_path).token_counts(), ShardDataset(directory).token_counts())


def test_a_completed_build_is_a_no_op(built, random_target, samples):
    directory, manifest = built
    before = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    again = build_shards(random_target, interrupted(samples, 0), directory, LAYERS, shard_tokens=200, batch_size=4)
    assert again == manifest
    assert {p.name: p.stat().st_mtime_ns for p in directory.iterdir()} == before


def test_resuming_refuses_another_target_other_layers_or_other_inputs(tmp_path, random_target, target, samples):
    with pytest.raises(KeyboardInterrupt):
        build_shards(random_target, interrupted(samples, 20), tmp_path, LAYERS, shard_tokens=200, batch_size=4)
    with pytest.raises(DraftsyncError, match="another target.*fingerprint"):
        build_shards(target, samples, tmp_path, LAYERS, shard_tokens=200, batch_size=4)
    with pytest.raises(DraftsyncError, match="aux_layer_ids"):
        build_shards(random_target, samples, tmp_path, (0, 2, 4), shard_tokens=200, batch_size=4)
    changed = [Sample(s.task, list(reversed(s.input_ids)), s.loss_mask) for s in samples]
    with pytest.raises(DraftsyncError, match="samples given differ"):
        build_shards(random_target, changed, tmp_path, LAYERS, shard_tokens=200, batch_size=4)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "shard-00000.safetensors").write_bytes(b"x")
    with pytest.raises(DraftsyncError, match="no manifest.json"):
        build_shards(random_target, samples, tmp_path / "other", LAYERS)


# ---- reading -----------------------------------------------------------------------------------------
def test_windows_cut_sequences_into_consecutive_pieces_of_seq_len(built, samples):
    data = ShardDataset(built[0])
    windows = data.windows(range(len(samples)), 16)
    expected_ids, expected_masks = [], []
    for sample in samples:
        for start in range(0, len(sample.input_ids), 16):
            piece = sample.input_ids[start : start + 16]
            if len(piece) >= 3:
                pad = 16 - len(piece)
                expected_ids.append(piece + [0] * pad)
                expected_masks.append(sample.loss_mask[start : start + 16] + [0] * pad)
    batch = data.batch(windows, 16)
    assert batch.ids.tolist() == expected_ids
    assert batch.loss_mask.to(torch.int64).tolist() == expected_masks
    assert batch.valid.sum(1).tolist() == windows[:, 2].tolist()
    assert batch.valid[:, 0].all() and not (batch.loss_mask & ~batch.valid).any()
    assert int(windows[:, 2].min()) >= 3


def test_batches_are_a_pure_function_of_step_and_seed(built, samples):
    first, second = ShardDataset(built[0], open_handles=1), ShardDataset(built[0])
    train, holdout = first.split(0.2, seed=0)
    assert set(train).isdisjoint(holdout) and sorted(train + holdout) == list(range(len(samples)))
    assert len(holdout) == 6 and (train, holdout) == second.split(0.2, seed=0) != first.split(0.2, seed=1)
    windows = first.windows(train, 16)
    per_epoch = windows.shape[0] // 8
    # Later steps first: a resumed run asks for step k without having asked for the ones before.
    for step in (per_epoch + 2, 3, 0):
        a = first.batch_for_step(step, 8, 16, 7, windows)
        b = second.batch_for_step(step, 8, 16, 7, windows)
        assert torch.equal(a.ids, b.ids) and torch.equal(a.aux, b.aux) and torch.equal(a.final, b.final)
    epoch = torch.cat([first.windows_for_step(k, 8, 7, windows) for k in range(per_epoch)])
    assert epoch.unique().numel() == per_epoch * 8  # no window twice within an epoch
    next_epoch = torch.cat([first.windows_for_step(k, 8, 7, windows) for k in range(per_epoch, 2 * per_epoch)])
    assert not torch.equal(epoch, next_epoch)
    assert not torch.equal(first.windows_for_step(0, 8, 7, windows), first.windows_for_step(0, 8, 8, windows))


def test_summary_rows_describe_every_sequence(built, samples):
    rows = ShardDataset(built[0]).summary_rows(chunk_tokens=50)
    assert [r["task"] for r in rows] == [s.task for s in samples]
    assert [r["length"] for r in rows] == [len(s.input_ids) for s in samples]
    assert [r["loss_tokens"] for r in rows] == [sum(s.loss_mask) for s in samples]
    assert [r["max_token_id"] for r in rows] == [max(s.input_ids) for s in samples]
    assert {(r["nonfinite"], r["aux_width"], r["final_width"]) for r in rows} == {(0, 192, 64)}


# ---- sample streams from text ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def text_target(tmp_path_factory):
    from draftsync.speculative.targets import load_target

    from tests.support.tiny_models import build_tiny_target

    return load_target(build_tiny_target(tmp_path_factory.mktemp("tiny-target")))


def test_teacher_forced_and_regenerated_samples_stream_and_restart_anywhere(text_target, tmp_path):
    model, tokenizer = text_target
    texts = teacher_forced_samples(
        tokenizer, [("code", "def f(x):\n    return x"), ("prose", "Free of charge.")], chunk=1
    )
    first = list(texts)
    assert first[0].input_ids[-1] == tokenizer.eos_token_id and all(first[1].loss_mask)
    assert first[0].input_ids[:-1] == tokenizer("def f(x):\n    return x")["input_ids"]
    assert list(texts.iter_from(1)) == first[1:]

    prompts = [("math", "The sum of 12"), ("code", "def add(a, b):"), ("prose", "Permission is"), ("math", "Then 42")]
    generated = regenerated_samples(model, tokenizer, prompts, max_new_tokens=6, batch_size=3)
    answers = list(generated)
    for (task, prompt), sample in zip(prompts, answers, strict=True):
        prompt_ids = tokenizer(prompt)["input_ids"]
        assert sample.task == task and sample.input_ids[: len(prompt_ids)] == prompt_ids
        assert sample.loss_mask == [0] * len(prompt_ids) + [1] * (len(sample.input_ids) - len(prompt_ids))
        assert 1 <= len(sample.input_ids) - len(prompt_ids) <= 6
    assert list(generated.iter_from(2)) == answers[2:]  # generation batches sit at fixed positions

    both = concat_samples(texts, generated)
    manifest = build_shards(model, both, tmp_path, (0, 1, 2), batch_size=2)
    assert manifest["mode"] == "teacher_forced+regenerated" and manifest["num_sequences"] == 6
    assert manifest["response_writer"] == "hf"
    assert manifest["target"]["name_or_path"] and manifest["source_fingerprint"] == both.fingerprint
    other = concat_samples(texts, regenerated_samples(model, tokenizer, prompts, max_new_tokens=5, batch_size=3))
    manifest["complete"] = False
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(DraftsyncError, match="source_fingerprint"):
        build_shards(model, other, tmp_path, (0, 1, 2), batch_size=2)


def test_a_failed_build_closes_its_source_so_a_server_it_started_stops(random_target, tmp_path):
    """A source that writes responses with vLLM holds a server while it streams: an error in the build (here a
    token outside the vocabulary) ends the stream at once (the loop's iterator goes as the error unwinds), so the
    source's cleanup runs before the error reaches the caller."""
    from draftsync.speculative.data.samples import SampleSource

    class Streaming(SampleSource):
        closed = False

        def __len__(self) -> int:
            return 4

        @property
        def fingerprint(self) -> str:
            return "streaming"

        def iter_from(self, start: int):
            try:
                for position in range(start, 4):
                    yield Sample("code", [1, 2, 10**6 if position == 2 else 3], [0, 1, 1])
            finally:
                Streaming.closed = True

    with pytest.raises(DraftsyncError, match="outside the target vocabulary"):
        build_shards(random_target, Streaming(), tmp_path, LAYERS, batch_size=2)
    assert Streaming.closed
