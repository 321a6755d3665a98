"""The sync's result keeps the keys users read (the flow's return value, `draftsync sync --json`, demo.json)."""

from __future__ import annotations

from draftsync.flows.sync import SkippedSync, SyncResult

from tests.unit.validation.test_validation_result import sample_validation

SYNC_KEYS = [
    "target_name",
    "target_version",
    "drafter_name",
    "drafter_version",
    "method",
    "gamma",
    "recommendation",
    "passed",
    "validation",
    "training",
    "dataset",
    "data_checks",
    "stages_s",
    "generation",
    "plan",
]
SKIPPED_KEYS = ["target_name", "target_version", "method", "skipped", "drafter_version", "run_id"]


def test_a_sync_result_has_exactly_the_keys_users_read():
    result = SyncResult(
        target_name="llm",
        target_version=2,
        drafter_name="llm-drafter",
        drafter_version=3,
        method="eagle3",
        gamma=4,
        recommendation={"method": "none"},
        passed=True,
        validation=sample_validation(),
        training={"steps": 20},
        dataset={"sequences": 8},
        data_checks={"passed": True},
        stages_s={"dataset": 1.0},
        generation=1,
    )
    assert list(result.as_dict()) == SYNC_KEYS
    assert result.as_dict()["validation"] == result.validation.as_dict()  # typed inside, JSON keys outside
    assert result.as_dict()["training"] is result.training  # the other nested results are the ones built


def test_a_skipped_sync_has_exactly_the_keys_users_read():
    assert list(SkippedSync("llm", 2, "eagle3", "done", 3, "run-1").as_dict()) == SKIPPED_KEYS
