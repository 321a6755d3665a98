"""The drafter trainer: every method learns from shards, resumes exactly after a crash, warm-starts fast."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.data.shard_reader import ShardDataset
from draftsync.speculative.train.batches import with_target_logits
from draftsync.speculative.train.checkpoints import CHECKPOINT_FILE
from draftsync.speculative.train.config import TrainConfig
from draftsync.speculative.train.training import _lr_at, evaluate, fit_drafter

SMALL = dict(draft_vocab_size=256, batch_size=8, seq_len=32, seed=0)


def holdout_accuracy(drafter, target, dataset: ShardDataset) -> float:
    _, holdout = dataset.split(0.05, 0)
    accuracy, _ = evaluate(
        drafter, dataset, dataset.windows(holdout, 32), target.get_output_embeddings(), 8, torch.device("cpu")
    )
    return accuracy[0]


# ---- every method --------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["eagle3", "eagle3.1", "eagle", "medusa", "draft_model"])
def test_every_method_learns_the_target_from_shards(method, target, chain_shards):
    full_vocabulary = method in ("eagle", "draft_model")  # both predict through the whole vocabulary
    shape = {**SMALL, "draft_vocab_size": None} if full_vocabulary else SMALL
    config = TrainConfig(method=method, steps=160, lr=3e-3, ttt_steps=2, medusa_heads=3, **shape)
    untrained, _ = fit_drafter(target, chain_shards, TrainConfig(method=method, steps=0, medusa_heads=3, **shape))
    drafter, report = fit_drafter(target, chain_shards, config)
    assert drafter.method == method and report.method == method
    assert report.steps == 160 and report.tokens > 0 and report.tokens_per_s > 0
    assert sum(report.losses[-5:]) / 5 < sum(report.losses[:5]) / 5
    assert report.top1_agreement > 0.8
    before = holdout_accuracy(untrained, target, chain_shards)
    if method == "draft_model":  # it starts from the target's embedding and head, which already chain here
        assert report.top1_agreement >= before - 0.02
    else:
        assert report.top1_agreement > before + 0.5
    assert len(report.position_accuracy) >= 2 or method == "draft_model"
    assert {"loss", "tokens_per_s", "accuracy_pos0"} <= set(report.history[-1])


def test_trained_eagle3_agrees_with_the_target_far_more_than_an_untrained_one(target, trained):
    drafter, report = trained
    assert report.steps == 100 and report.draft_vocab_size == 256
    assert list(drafter.config.aux_layer_ids) == [1, 2, 3]
    assert report.losses[-1] < report.losses[0] / 2
    assert report.top1_agreement > 0.8 and report.holdout_positions > 0
    # later draft positions are harder, but training-time test keeps them useful
    assert report.position_accuracy[1] > 0.5


def test_training_is_deterministic_and_reports_progress(target, chain_shards):
    seen = []
    config = TrainConfig(method="eagle3", steps=4, draft_vocab_size=128, batch_size=4, seq_len=16, seed=3)
    first, report = fit_drafter(target, chain_shards, config, on_progress=lambda s, n, m: seen.append((s, n)))
    second, _ = fit_drafter(target, chain_shards, config)
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    for name, tensor in first.state_dict().items():
        assert torch.equal(tensor, second.state_dict()[name]), name
    assert report.draft_vocab_size == 128 and int(first.t2d.sum()) == 128


def test_loss_masks_choose_the_draft_vocabulary(target, tmp_path, make_chain_shards):
    dataset = make_chain_shards(
        target, [[1, 2, 3, 4, 5, 6, 7, 8] * 2], tmp_path / "d", masks=[[0, 0, 0, 0, 1, 1, 1, 1] * 2]
    )
    drafter, _ = fit_drafter(
        target, dataset, TrainConfig(draft_vocab_size=4, steps=1, batch_size=1, seq_len=16, holdout_fraction=0.0)
    )
    assert drafter.draft_token_ids.tolist() == [5, 6, 7, 8]


def test_bf16_autocast_trains_as_well_as_fp32(target, chain_shards):
    """bf16 autocast over fp32 weights (the default on CUDA and on CPUs with native bf16) against fp32."""
    config = TrainConfig(method="eagle3", steps=100, lr=3e-3, ttt_steps=2, precision="fp32", **SMALL)
    fp32, fp32_report = fit_drafter(target, chain_shards, config)
    bf16, bf16_report = fit_drafter(target, chain_shards, TrainConfig(**{**config.__dict__, "precision": "bf16"}))
    assert bf16_report.losses != fp32_report.losses  # autocast was on: the matmuls ran in bf16
    assert all(torch.isfinite(torch.tensor(bf16_report.losses)))
    assert all(p.dtype == torch.float32 for p in bf16.parameters())  # the weights stay fp32
    assert bf16_report.top1_agreement > 0.8
    assert abs(bf16_report.top1_agreement - fp32_report.top1_agreement) < 0.05
    with pytest.raises(DraftsyncError, match="precision 'fp8'"):
        fit_drafter(target, chain_shards, TrainConfig(steps=1, precision="fp8", **SMALL))


def test_bad_training_input_is_named(target, random_target, chain_shards):
    with pytest.raises(DraftsyncError, match="another target"):
        fit_drafter(random_target, chain_shards, TrainConfig(steps=1, **SMALL))
    with pytest.raises(DraftsyncError, match="aux states of layers"):
        fit_drafter(target, chain_shards, TrainConfig(steps=1, aux_layer_ids=(0, 2, 4), **SMALL))
    with pytest.raises(DraftsyncError, match="steps"):
        fit_drafter(target, chain_shards, TrainConfig(steps=-1, **SMALL))
    with pytest.raises(DraftsyncError, match="ttt_steps"):
        fit_drafter(target, chain_shards, TrainConfig(steps=1, ttt_steps=0, **SMALL))
    with pytest.raises(DraftsyncError, match="ttt_feed 'guess'"):
        fit_drafter(target, chain_shards, TrainConfig(steps=1, ttt_feed="guess", **SMALL))
    with pytest.raises(DraftsyncError, match="EAGLE-3 drafters only, not medusa"):
        fit_drafter(target, chain_shards, TrainConfig(method="medusa", steps=1, ttt_feed="target", **SMALL))
    with pytest.raises(DraftsyncError, match="position_decay 0.0"):
        fit_drafter(target, chain_shards, TrainConfig(steps=1, position_decay=0.0, **SMALL))
    with pytest.raises(DraftsyncError, match="teacher_temperature 0.0"):
        fit_drafter(target, chain_shards, TrainConfig(steps=1, teacher_temperature=0.0, **SMALL))


def test_a_sharpened_teacher_is_the_targets_distribution_at_that_temperature(target, chain_shards):
    batch = chain_shards.batch_for_step(0, 2, 16, 0, chain_shards.windows(list(range(4)), 16))
    head = target.get_output_embeddings()
    plain = with_target_logits(batch, head).target_logits
    batch.target_logits = None
    sharp = with_target_logits(batch, head, 0.5).target_logits
    assert torch.allclose(sharp, 2 * plain)
    assert torch.equal(sharp.argmax(-1), plain.argmax(-1))  # the greedy token, what T=0 accepts, is unchanged


def test_the_schedule_warms_up_then_decays_to_its_floor():
    config = TrainConfig(steps=100, lr=1e-3, warmup_steps=10, min_lr_ratio=0.0)
    rates = [_lr_at(config, step) for step in range(100)]
    assert rates[0] == pytest.approx(1e-4) and max(rates) == pytest.approx(rates[9], rel=0.01)
    assert rates[-1] < 1e-6  # decays to zero
    floored = TrainConfig(steps=100, lr=1e-3, warmup_steps=10)
    assert _lr_at(floored, 99) == pytest.approx(1e-4, rel=0.01)  # the default floor: a tenth of the peak


def test_the_sync_profile_is_what_the_trainer_runs():
    from draftsync.profiles import profile

    demo = profile("demo")
    cold, warm = TrainConfig.from_profile(demo, warm_start=False), TrainConfig.from_profile(demo, warm_start=True)
    assert (cold.steps, warm.steps) == (demo.train_steps, demo.warm_start_steps)
    assert (cold.ttt_steps, cold.position_decay, cold.min_lr_ratio) == (
        demo.ttt_steps,
        demo.position_decay,
        demo.min_lr_ratio,
    )
    assert cold.draft_vocab_size == demo.draft_vocab_size
    sharpened = TrainConfig.from_profile(demo.model_copy(update={"teacher_temperature": 0.25}), False)
    assert cold.teacher_temperature == 1.0 and sharpened.teacher_temperature == 0.25
    assert TrainConfig.from_profile(demo.model_copy(update={"method": "eagle"}), False).draft_vocab_size is None


# ---- checkpoints and resume -----------------------------------------------------------------------
def test_a_run_interrupted_after_a_checkpoint_resumes_to_the_same_weights(target, chain_shards, tmp_path):
    config = TrainConfig(method="eagle3", steps=8, checkpoint_every=3, noise_std=0.05, **SMALL)
    reference, reference_report = fit_drafter(target, chain_shards, config)

    def crash_at_step_5(step, _total, _metrics):
        if step == 5:
            raise KeyboardInterrupt("simulated crash")

    with pytest.raises(KeyboardInterrupt):
        fit_drafter(target, chain_shards, config, checkpoint_dir=tmp_path, on_progress=crash_at_step_5)
    resumed, report = fit_drafter(target, chain_shards, config, checkpoint_dir=tmp_path)
    assert report.resumed_from_step == 3 and report.steps == 8
    assert report.losses == pytest.approx(reference_report.losses)
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], tensor, msg=name)


def test_a_checkpoint_of_another_run_is_refused_not_mixed_in(target, chain_shards, tmp_path):
    fit_drafter(target, chain_shards, TrainConfig(steps=2, checkpoint_every=1, **SMALL), checkpoint_dir=tmp_path)
    with pytest.raises(DraftsyncError, match="another run"):
        fit_drafter(
            target, chain_shards, TrainConfig(steps=2, checkpoint_every=1, lr=1e-4, **SMALL), checkpoint_dir=tmp_path
        )
    with pytest.raises(DraftsyncError, match="another run"):  # the learning-rate schedule spans `steps`
        fit_drafter(target, chain_shards, TrainConfig(steps=4, checkpoint_every=1, **SMALL), checkpoint_dir=tmp_path)
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"torn")
    with pytest.raises(DraftsyncError, match="cannot be read"):
        fit_drafter(target, chain_shards, TrainConfig(steps=2, checkpoint_every=1, **SMALL), checkpoint_dir=tmp_path)


def test_training_leaves_the_target_where_it_was_and_hands_back_a_drafter_of_its_own(target, chain_shards):
    """No tensor is shared across modules on different devices: the trained drafter, moved to the CPU or anywhere,
    never takes a target's tensor with it."""
    where = {name: p.device for name, p in target.named_parameters()}
    drafter, _ = fit_drafter(target, chain_shards, TrainConfig(method="eagle3", steps=2, **SMALL))
    assert {name: p.device for name, p in target.named_parameters()} == where
    target_storage = {p.untyped_storage().data_ptr() for p in target.parameters()}
    shared = [n for n, p in drafter.named_parameters() if p.untyped_storage().data_ptr() in target_storage]
    assert shared == []
    dtypes = {name: p.dtype for name, p in target.named_parameters()}
    drafter.double()  # Module.to swaps a parameter's data in place, as a move to a GPU does
    assert {name: p.dtype for name, p in target.named_parameters()} == dtypes


TRAIN_SCRIPT = """
import json, sys, time
import torch
from transformers import LlamaForCausalLM
from draftsync.speculative.data.shard_reader import ShardDataset
from draftsync.speculative.train.config import TrainConfig
from draftsync.speculative.train.training import fit_drafter
torch.set_num_threads(1)
target = LlamaForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
config = TrainConfig(**json.loads(sys.argv[3]))
fit_drafter(target, ShardDataset(sys.argv[2]), config, checkpoint_dir=sys.argv[4],
              on_progress=lambda *_: time.sleep(0.2))
"""


def test_kill_9_during_training_then_rerun_ends_where_an_uninterrupted_run_ends(target, chain_shards, tmp_path):
    target_dir = tmp_path / "target"
    target.save_pretrained(target_dir)
    config = dict(method="eagle3", steps=30, checkpoint_every=4, **SMALL)
    checkpoints = tmp_path / "checkpoints"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            TRAIN_SCRIPT,
            str(target_dir),
            str(chain_shards.path),
            json.dumps(config),
            str(checkpoints),
        ],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])},
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and worker.poll() is None:
            if (checkpoints / CHECKPOINT_FILE).exists():
                state = torch.load(checkpoints / CHECKPOINT_FILE, weights_only=False)
                if state["step"] >= 8:
                    break
            time.sleep(0.2)
        assert worker.poll() is None, "the training process ended before it could be killed"
        os.kill(worker.pid, signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
    finally:
        if worker.poll() is None:
            worker.kill()
    killed_at = torch.load(checkpoints / CHECKPOINT_FILE, weights_only=False)["step"]
    assert 8 <= killed_at < 30

    resumed, report = fit_drafter(target, chain_shards, TrainConfig(**config), checkpoint_dir=checkpoints)
    uninterrupted, reference = fit_drafter(target, chain_shards, TrainConfig(**config))
    assert report.resumed_from_step == killed_at and report.steps == 30
    assert report.losses == pytest.approx(reference.losses, rel=1e-4, abs=1e-5)
    for name, tensor in uninterrupted.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


# ---- warm start -----------------------------------------------------------------------------------
def test_warm_start_copies_the_previous_drafter(target, trained, chain_shards):
    previous = trained[0]
    warm, report = fit_drafter(target, chain_shards, TrainConfig(steps=0, **SMALL), init_from=previous)
    assert report.steps == 0 and report.warm_start_tensors > 0
    for name, tensor in previous.state_dict().items():
        assert torch.equal(tensor, warm.state_dict()[name]), name


def test_warm_start_reaches_the_cold_drafters_acceptance_in_half_the_steps(
    trained, chain_data, tmp_path, drifted_target, make_chain_shards
):
    """The TLT paper's co-evolving drafter: after a target fine-tune, start from the old drafter."""
    new_target = drifted_target
    dataset = make_chain_shards(new_target, chain_data, tmp_path / "v2")
    config = dict(method="eagle3", ttt_steps=2, **SMALL)
    cold, cold_report = fit_drafter(new_target, dataset, TrainConfig(steps=30, **config))
    warm, warm_report = fit_drafter(new_target, dataset, TrainConfig(steps=15, **config), init_from=trained[0])
    assert warm_report.warm_start_tensors > 0
    assert warm_report.top1_agreement >= cold_report.top1_agreement
