"""validate_drafter on the reference engine with tiny checkpoints: the gamma sweep stops at what the drafter
proposes, and no load per batch size is asked of the reference server, which answers one request at a time (the
schedule is measured on vLLM: tests/e2e/vllm/test_vllm_checklist.py). Stress runs for real, against reference
servers."""

from __future__ import annotations

import pytest
from draftsync.profiles import ValidationProfile
from draftsync.tasks.validation import validate_drafter
from draftsync.validation.result import ChecklistResult

# Thresholds at zero: these tests read what is recorded, not whether a random drafter passes.
PROFILE = ValidationProfile(
    name="tiny",
    backend="reference",
    requests=3,
    max_tokens=12,
    gamma_range=(2, 4),
    sweep_requests=1,
    min_acceptance=0.0,
    min_p50=0.0,
    min_p5=0.0,
    min_speedup=0.0,
    stress_requests=2,
    schedule_batch_sizes=(1, 8),
    long_requests=1,
    long_max_tokens=16,
    min_long_acceptance=0.0,
    length_buckets=(0, 16),
    max_memory_overhead=10.0,
)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(target, EAGLE-3 drafter, Medusa drafter with 2 heads)."""
    from draftsync.speculative.methods.registry import new_drafter, save_drafter
    from draftsync.speculative.targets import load_target

    from tests.support.tiny_models import build_tiny_drafter, build_tiny_target

    root = tmp_path_factory.mktemp("validation")
    target_dir = build_tiny_target(root / "target")
    target, _ = load_target(target_dir)
    medusa = save_drafter(
        new_drafter("medusa", target.config, num_heads=2, num_layers=1),
        root / "medusa",
        str(target_dir),
        list(target.config.architectures),
        2,
    )
    return target_dir, build_tiny_drafter(target_dir, root / "eagle3", gamma=3), medusa


def validate(target_dir, drafter_dir) -> ChecklistResult:
    return validate_drafter.fn(str(target_dir), str(drafter_dir), {"code": 1.0}, PROFILE)


def test_a_medusa_drafter_gets_no_schedule_and_a_knee_within_its_heads(checkpoints):
    target_dir, _, medusa = checkpoints
    result = validate(target_dir, medusa)
    assert [row["gamma"] for row in result.gamma_sweep] == [2]  # 2..4 asked, 2 heads
    assert result.gamma_knee == 2
    assert result.stress["errors"] == 0 and "by_batch_size" not in result.stress  # nothing could use the levels
    assert result.speculation_schedule is None
    assert result.speculation_schedule_note is not None
    assert "exactly num_speculative_tokens at every batch size" in result.speculation_schedule_note


def test_the_reference_server_is_asked_for_no_load_per_batch_size(checkpoints):
    target_dir, eagle3, _ = checkpoints
    result = validate(target_dir, eagle3)
    assert [row["gamma"] for row in result.gamma_sweep] == [2, 3, 4]
    assert result.backend == "reference"
    # One request at a time: its levels would measure queueing, not batching, so the profile's (1, 8) are not run.
    assert result.stress["errors"] == 0 and result.stress["plain"]["requests"] == PROFILE.stress_requests
    assert "by_batch_size" not in result.stress
    assert result.speculation_schedule is None and result.speculation_schedule_note is None


def test_a_dflash_drafter_is_swept_within_its_block_and_gets_no_schedule(checkpoints, tmp_path):
    from tests.support.tiny_models import build_tiny_dflash

    target_dir = checkpoints[0]
    dflash = build_tiny_dflash(target_dir, tmp_path / "dflash", gamma=2)  # block 4: up to 3 draft tokens
    result = validate(target_dir, dflash)
    assert [row["gamma"] for row in result.gamma_sweep] == [2, 3]  # 2..4 asked
    assert result.speculation_schedule is None
    assert "vLLM's dflash drafts exactly num_speculative_tokens" in result.speculation_schedule_note
