"""The validation result keeps the keys users read: `draftsync validate --json`, a sync's `validation`, and
validation.json in the reports (the same less what is known only after it is written)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

from draftsync.validation.checklist import Gate
from draftsync.validation.result import (
    AcceptanceFigures,
    ChecklistResult,
    MemoryFootprint,
    RequestCounts,
    SuiteExpectation,
    SuiteResult,
    TpotMs,
    ValidationResult,
)

REPORT_KEYS = [
    "profile",
    "backend",
    "temperature",
    "passed",
    "gates",
    "gamma_sweep",
    "gamma_knee",
    "gamma_fastest",
    "knee_reason",
    "draft_sampling",
    "gammas_rejected",
    "sweep_plain_tpot_ms",
    "acceptance",
    "acceptance_greedy",
    "mean_acceptance_length",
    "acceptance_by_position",
    "acceptance_by_length",
    "tpot_ms",
    "speedup",
    "stress",
    "speculation_schedule",
    "speculation_schedule_note",
    "memory",
    "requests",
    "suite",
    "target_name",
    "target_version",
    "drafter_name",
    "drafter_version",
    "trained_for_target_version",
]
VALIDATION_KEYS = [*REPORT_KEYS, "promoted", "reports_dir"]
GATE_KEYS = ["name", "value", "threshold", "comparison", "detail", "passed"]
NESTED_KEYS = {
    "acceptance": ["mean", "p5", "p50", "p90", "p99"],
    "tpot_ms": ["spec", "plain"],
    "memory": ["drafter_bytes", "target_bytes", "overhead"],
    "requests": ["validation", "sweep", "long", "long_max_tokens", "stress", "engine_starts"],
}


def sample_validation(suite_passed: bool = True) -> ValidationResult:
    """A validation as the flow builds it, with made-up figures."""
    checklist = ChecklistResult(
        profile="test",
        backend="reference",
        temperature=0.0,
        gates=(
            Gate("data_coverage", 0, 0, "==", "failed data expectations of the training set"),
            Gate("validation_acceptance_mean", 0.712345, 0.55, ">", "pooled, T=0"),
            Gate("stress_speedup", None, 1.0, ">", "not run"),
        ),
        gamma_sweep=[
            {"gamma": 2, "mean_acceptance_length": 2.1, "acceptance_rate": 0.7, "tpot_ms": 3.0},
            {"gamma": 3, "mean_acceptance_length": 2.4, "acceptance_rate": 0.62, "tpot_ms": 2.9},
        ],
        gamma_knee=2,
        gamma_fastest=3,
        gammas_rejected=[{"gamma": 3, "failed_gates": ["acceptance_p5"]}],
        sweep_plain_tpot_ms=4.0,
        acceptance=AcceptanceFigures(mean=0.7, p5=0.4, p50=0.7, p90=0.9, p99=1.0),
        acceptance_greedy=0.71,
        mean_acceptance_length=2.1,
        acceptance_by_position=[0.8, 0.6],
        acceptance_by_length=[{"min_tokens": 0, "max_tokens": None, "requests": 4, "acceptance_rate": 0.7}],
        tpot_ms=TpotMs(spec=3.0, plain=4.0),
        speedup=1.33,
        stress=None,
        speculation_schedule=None,
        speculation_schedule_note=None,
        memory=MemoryFootprint(drafter_bytes=10, target_bytes=100, overhead=0.1),
        requests=RequestCounts(validation=4, sweep=2, long=1, long_max_tokens=64, stress=0),
        rows=[{"request": 0, "phase": "validation", "gamma": 2}],
    )
    return ValidationResult(
        checklist=checklist,
        suite=SuiteResult(
            (SuiteExpectation("at_least_one_request", 4, suite_passed, ">= 1 request", "expect_table_row_count"),),
            {"p5": 0.4, "p50": 0.7, "p90": 0.9, "p99": 1.0},
        ),
        target_name="llm",
        target_version=2,
        drafter_name="llm-drafter",
        drafter_version=3,
        trained_for_target_version=2,
        promoted=False,
        reports_dir="/work/validations/llm/drafter-v3-target-v2",
    )


def test_a_validation_result_has_exactly_the_keys_users_read():
    result = sample_validation()
    data = result.as_dict()
    assert list(data) == VALIDATION_KEYS
    assert list(result.report_dict()) == REPORT_KEYS  # validation.json: written before promotion, in reports_dir
    for gate in data["gates"]:
        assert list(gate) == GATE_KEYS
    for key, keys in NESTED_KEYS.items():
        assert list(data[key]) == keys, key
    json.dumps(data)  # plain JSON: the nested types are converted too


def test_the_json_reports_gates_rounded_and_unmeasured_as_null():
    gates = sample_validation().as_dict()["gates"]
    assert [g["value"] for g in gates] == [0.0, 0.7123, None]
    assert [g["passed"] for g in gates] == [True, True, False]
    assert Gate("nan", math.nan, 1.0, ">").reported_value is None


def test_passed_needs_every_gate_and_the_suite():
    result = sample_validation()
    assert result.checklist.failed_gates == ["stress_speedup"]
    assert not result.passed and result.as_dict()["passed"] is False
    measured = replace(result.checklist, gates=result.checklist.gates[:2])
    assert replace(result, checklist=measured).as_dict()["passed"] is True
    assert replace(sample_validation(suite_passed=False), checklist=measured).as_dict()["passed"] is False


def test_the_per_request_rows_stay_out_of_the_json():
    result = replace(sample_validation(), promoted=True)
    assert "rows" not in result.as_dict() and result.checklist.rows
    assert result.as_dict()["promoted"] is True


def test_the_report_shows_the_engine_starts_and_how_the_measured_schedule_did():
    from draftsync.flows.validate import _markdown

    result = sample_validation()
    assert "engine starts" not in _markdown(result) and "per batch size" not in _markdown(result)
    stress = {
        "schedule_check": {
            1: {
                "k": 2,
                "scheduled_ms_per_token": 8.0,
                "speculative_ms_per_token": 8.2,
                "plain_ms_per_token": 10.0,
                "speedup": 1.25,
            },
            8: {
                "k": 0,
                "scheduled_ms_per_token": 4.1,
                "speculative_ms_per_token": 3.9,
                "plain_ms_per_token": 4.0,
                "speedup": 0.9756,
            },
        },
        "schedule_measured": [(1, 7, 2), (8, 8, 0)],
        "schedule_note": "k = 0 was slower than speculating at gamma 2 at concurrency 8: vLLM still runs the drafter",
    }
    on_vllm = replace(
        result.checklist,
        backend="vllm",
        stress=stress,
        speculation_schedule=[(1, 7, 2), (8, 8, 0)],
        requests=replace(result.checklist.requests, engine_starts=3),
    )
    text = _markdown(replace(result, checklist=on_vllm))
    assert "backend `vllm` (3 engine starts)" in text
    assert "`num_speculative_tokens_per_batch_size`: [(1, 7, 2), (8, 8, 0)]" in text
    assert "| 1 | 2 | 8 | 8.2 | 10 | 1.25 |" in text and "| 8 | 0 | 4.1 | 3.9 | 4 | 0.9756 |" in text
    assert "Revised from [(1, 7, 2), (8, 8, 0)]: k = 0 was slower than speculating at gamma 2 at concurrency 8" in text


def test_the_report_names_the_gamma_validation_stepped_down_from():
    from draftsync.flows.validate import _markdown

    text = _markdown(sample_validation())
    assert "| 2 (knee) | 2.100 | 0.700 | 3.000 |" in text
    assert "| 3 (validated, failed acceptance_p5) | 2.400 | 0.620 | 2.900 |" in text


def test_the_served_gammas_reason_names_the_rule_that_chose_it():
    from draftsync.validation.result import knee_reason

    sweep = [
        {"gamma": 2, "acceptance_rate": 0.80, "tpot_ms": 15.59},
        {"gamma": 3, "acceptance_rate": 0.75, "tpot_ms": 15.40},
        {"gamma": 5, "acceptance_rate": 0.65, "tpot_ms": 11.50},
    ]
    assert knee_reason(sweep, 5, 5, [], 0.02, 0.7) == "it has the best TPOT of the sweep"
    assert "within the knee tolerance of 2%" in knee_reason(sweep, 2, 3, [], 0.02, 0.7)
    floor = knee_reason(sweep, 2, 5, [], 0.02, 0.7)
    assert "gamma 5 is fastest" in floor and "does not clear 0.70" in floor
    stepped = knee_reason(sweep, 2, 5, [{"gamma": 5, "failed_gates": ["acceptance_p5"]}], 0.02, 0.7)
    assert "stepped down" in stepped and "gamma 5 failed acceptance_p5" in stepped
