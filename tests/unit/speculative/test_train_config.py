"""What a training checkpoint must agree with to resume: the run's computation, not where it runs."""

from __future__ import annotations

from draftsync.speculative.train.config import TrainConfig

# TrainConfig(device="cpu").fingerprint() (cold and warm-started) as checkpoints were written before placement was
# left out of it: a CPU sync's checkpoint resumes across the change.
WRITTEN_ON_THE_CPU = ("102524879b93243c", "9b8756885fe8e501")


def test_every_rank_of_a_torchrun_job_resumes_the_leaders_checkpoint():
    """Each rank trains on its own GPU (cuda:LOCAL_RANK); all must read the checkpoint the leader wrote."""
    on_each = {TrainConfig(device=device).fingerprint() for device in ("cuda:0", "cuda:1", "cuda", "cpu", "auto")}
    assert len(on_each) == 1


def test_a_cpu_checkpoint_written_before_placement_was_left_out_still_resumes():
    config = TrainConfig(device="cpu")
    assert (config.fingerprint(), config.fingerprint(warm_start=True)) == WRITTEN_ON_THE_CPU


def test_what_changes_the_numbers_still_tells_runs_apart():
    plain = TrainConfig().fingerprint()
    assert TrainConfig(precision="fp32").fingerprint() != plain
    assert TrainConfig(lr=1e-4).fingerprint() != plain
    assert TrainConfig().fingerprint(warm_start=True) != plain
