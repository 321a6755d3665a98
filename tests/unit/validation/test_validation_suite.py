"""The gates as a GE suite: good per-request rows pass; each bad table fails on the expectation that guards it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from draftsync.errors import DraftsyncError
from draftsync.serving.evaluation import RequestResult
from draftsync.validation import suite

THRESHOLDS = {"min_acceptance": 0.7, "p50": 0.7, "p5": 0.5, "tasks": ["code", "math"]}
NAMES = [
    "at_least_one_request",
    "every_request_produced_output",
    "no_request_failed",
    "acceptance_rate_within_0_1",
    "accepted_at_most_draft_tokens",
    "acceptance_mean_above_min",
    "acceptance_p50_above_min",
    "acceptance_p5_above_min",
    "tasks_present",
]


def request(
    index: int, accepted: int, draft_tokens: int = 20, output_tokens: int = 24, task: str | None = None, **extra
) -> dict:
    """One request's table row, as the evaluation backends produce it (gamma 4: drafts = draft tokens / 4)."""
    result = RequestResult(
        index=index,
        task=task or ("code", "math")[index % 2],
        prompt_tokens=12,
        output_tokens=output_tokens,
        drafts=draft_tokens // 4,
        draft_tokens=draft_tokens,
        accepted=accepted,
        accepted_per_position=[min(accepted, draft_tokens // 4)] + [0, 0, 0],
        seconds=0.5,
        ttft_s=0.05,
    )
    return {**result.row(), **extra}


def good_rows(n: int = 40) -> list[dict]:
    return [request(i, accepted=15 + i % 4) for i in range(n)]  # rates 0.75 .. 0.90


def run_validation_suite(rows: list[dict], thresholds: dict) -> dict:
    """The suite's result as suite.json holds it, its typed verdicts checked against it on the way."""
    result = suite.run_validation_suite(rows, thresholds)
    report = result.as_dict()
    assert result.failed == [e["name"] for e in report["expectations"] if not e["passed"]]
    assert report["passed"] == (not result.failed)
    return report


def failures(report: dict) -> dict[str, object]:
    return {e["name"]: e["observed"] for e in report["expectations"] if not e["passed"]}


def test_good_rows_pass_every_expectation_in_a_fixed_order():
    rows = good_rows()
    report = run_validation_suite(rows, THRESHOLDS)

    assert report["passed"], failures(report)
    assert [e["name"] for e in report["expectations"]] == NAMES
    observed = {e["name"]: e["observed"] for e in report["expectations"]}
    rates = [r["acceptance_rate"] for r in rows]
    assert observed["at_least_one_request"] == 40
    assert observed["acceptance_mean_above_min"] == pytest.approx(np.mean(rates))
    assert observed["tasks_present"] == ["code", "math"]
    assert observed["no_request_failed"] == {"unexpected_count": 0, "unexpected": []}
    json.dumps(report)  # the report goes into MLflow and --json output as it is


def test_low_p5_with_a_good_mean_fails_only_the_percentile_gate():
    rows = [request(i, accepted=19) for i in range(36)] + [request(i, accepted=0) for i in range(36, 40)]
    rates = [r["acceptance_rate"] for r in rows]
    assert np.mean(rates) > THRESHOLDS["min_acceptance"]  # the mean alone would let this drafter through

    report = run_validation_suite(rows, THRESHOLDS)

    assert not report["passed"]
    assert failures(report) == {"acceptance_p5_above_min": pytest.approx(0.0)}
    p50 = next(e for e in report["expectations"] if e["name"] == "acceptance_p50_above_min")
    assert p50["observed"] == pytest.approx(0.95) and p50["passed"]


def test_quantiles_are_numpy_linear_percentiles_of_the_drafted_requests():
    """GE's pandas default is 'nearest'; the suite asks for 'linear' so it reports what the checklist reports."""
    accepted = [0, 4, 8, 12, 16, 20]  # rates 0.0 .. 1.0 in steps of 0.2
    rows = [request(i, accepted=a) for i, a in enumerate(accepted)]
    rows.append(request(6, accepted=0, draft_tokens=0, output_tokens=1))  # drafted nothing: it has no rate
    rates = [r["acceptance_rate"] for r in rows[:-1]]
    assert np.percentile(rates, 5, method="linear") != np.percentile(rates, 5, method="nearest")

    report = run_validation_suite(rows, {**THRESHOLDS, "p5": 0.0, "p50": 0.0, "min_acceptance": 0.0})
    observed = {e["name"]: e["observed"] for e in report["expectations"]}

    assert observed["acceptance_p5_above_min"] == pytest.approx(np.percentile(rates, 5))  # 0.05, 'nearest' says 0.0
    assert observed["acceptance_p50_above_min"] == pytest.approx(np.percentile(rates, 50))  # its own value, not P5's
    assert report["acceptance_quantiles"] == pytest.approx({f"p{q}": np.percentile(rates, q) for q in (5, 50, 90, 99)})
    assert report["passed"], failures(report)


def test_a_quantile_equal_to_its_threshold_fails_as_the_gate_is_strict():
    rows = [request(i, accepted=10) for i in range(10)]  # every rate exactly 0.5

    report = run_validation_suite(rows, {**THRESHOLDS, "p5": 0.5, "p50": 0.4, "min_acceptance": 0.4})

    assert failures(report) == {"acceptance_p5_above_min": 0.5}


def test_failed_and_empty_requests_are_named_with_their_request_ids():
    rows = good_rows(10)
    rows[3] = request(3, accepted=0, draft_tokens=0, output_tokens=0, error="timed out after 30 s")
    rows[6] = request(6, accepted=15, output_tokens=0)

    report = run_validation_suite(rows, THRESHOLDS)

    failed = failures(report)
    assert set(failed) == {"every_request_produced_output", "no_request_failed"}
    assert failed["no_request_failed"] == {
        "unexpected_count": 1,
        "unexpected": [{"request": 3, "error": "timed out after 30 s"}],
    }
    assert failed["every_request_produced_output"]["unexpected_count"] == 2
    assert sorted(r["request"] for r in failed["every_request_produced_output"]["unexpected"]) == [3, 6]


def test_more_accepted_than_drafted_breaks_the_counters_checks():
    rows = good_rows(10)
    rows[4] = request(4, accepted=25)

    failed = failures(run_validation_suite(rows, THRESHOLDS))

    assert set(failed) == {"acceptance_rate_within_0_1", "accepted_at_most_draft_tokens"}
    assert failed["acceptance_rate_within_0_1"]["unexpected"] == [{"request": 4, "acceptance_rate": 1.25}]
    assert failed["accepted_at_most_draft_tokens"]["unexpected"] == [{"request": 4, "draft_tokens": 20, "accepted": 25}]


def test_a_missing_task_and_a_low_mean_fail_with_what_was_seen():
    rows = [request(i, accepted=12, task="code") for i in range(10)]  # rates 0.6

    failed = failures(run_validation_suite(rows, {**THRESHOLDS, "p50": 0.5}))

    assert failed == {"tasks_present": ["code"], "acceptance_mean_above_min": pytest.approx(0.6)}


def test_no_requests_and_no_drafts_fail_rather_than_pass():
    empty = failures(run_validation_suite([], THRESHOLDS))
    assert empty["at_least_one_request"] == 0
    assert {"acceptance_mean_above_min", "acceptance_p5_above_min", "tasks_present"} <= set(empty)

    undrafted = [request(i, accepted=0, draft_tokens=0) for i in range(4)]  # speculation was off
    failed = failures(run_validation_suite(undrafted, THRESHOLDS))
    assert failed == {
        "acceptance_mean_above_min": None,
        "acceptance_p50_above_min": None,
        "acceptance_p5_above_min": None,
    }


def test_bad_input_names_the_thing_and_the_fix():
    with pytest.raises(DraftsyncError, match=r"lack \['p5'\]"):
        run_validation_suite(good_rows(4), {k: v for k, v in THRESHOLDS.items() if k != "p5"})
    with pytest.raises(DraftsyncError, match="not a non-empty list"):
        run_validation_suite(good_rows(4), {**THRESHOLDS, "tasks": "code"})
    with pytest.raises(DraftsyncError, match=r"lack the columns \['accepted'\]"):
        run_validation_suite([{k: v for k, v in r.items() if k != "accepted"} for r in good_rows(4)], THRESHOLDS)
