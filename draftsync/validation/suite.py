"""The acceptance gates as a Great Expectations suite over the per-request results table.

The checklist computes its gates in Python (`checklist.py`); the same gates as GE expectations give a
second, declarative reading of the per-request table (one row per `RequestResult.row()`) that data teams
already know how to read, store and render. Each expectation has a stable name and reports what it saw.

Three points where GE 1.24 differs from the gates, all settled here:
- Quantiles: on pandas, `expect_column_quantile_values_to_be_between` calls `Series.quantile` with
  `interpolation=allow_relative_error`, and `False` (its default) means "nearest". The gates use numpy's
  default "linear" percentile, so the suite passes `allow_relative_error="linear"`: the P5 and P50 it
  reports are `numpy.percentile(rates, q)` over the requests that drafted (NaN rates are skipped).
- One quantile expectation, not one per quantile: GE sets the metric's `quantiles` after the metric's id
  was computed, so two quantile expectations on one column share a metric and report the same values.
  P5, P50, P90 and P99 come from one expectation, split into one gate per bounded quantile.
- Bounds: GE's quantile ranges are inclusive and also accept a value within 1e-4 (relative) of a bound;
  the gates are strict (P5 > threshold), so each quantile gate compares GE's value with its threshold
  itself. The mean uses GE's own `strict_min`.
"""

from __future__ import annotations

import math
from typing import Any

from draftsync.errors import DraftsyncError
from draftsync.validation.expectations import expectation_of, expectation_types, plain, run_expectations
from draftsync.validation.result import SuiteExpectation, SuiteResult

REQUIRED_COLUMNS = ("request", "task", "output_tokens", "drafts", "draft_tokens", "accepted", "acceptance_rate")
THRESHOLD_KEYS = ("min_acceptance", "p50", "p5", "tasks")
QUANTILE_INTERPOLATION = "linear"  # numpy.percentile's default, as the checklist's gates use
QUANTILES = {"p5": 0.05, "p50": 0.5, "p90": 0.9, "p99": 0.99}  # one expectation: see the module docstring


def _check_thresholds(thresholds: dict) -> tuple[float, float, float, list[str]]:
    missing = [key for key in THRESHOLD_KEYS if key not in thresholds]
    if missing:
        raise DraftsyncError(
            f"validation thresholds lack {missing}",
            'pass {"min_acceptance": 0.7, "p50": 0.7, "p5": 0.5, "tasks": ["code", "math"]}',
        )
    tasks = thresholds["tasks"]
    if isinstance(tasks, str) or not tasks or not all(isinstance(t, str) for t in tasks):
        raise DraftsyncError(
            f"validation threshold tasks={tasks!r} is not a non-empty list of task names",
            'list the tasks the requests must cover, e.g. ["code", "math"]',
        )
    try:
        values = [float(thresholds[key]) for key in ("min_acceptance", "p50", "p5")]
    except (TypeError, ValueError) as exc:
        raise DraftsyncError(
            f"validation thresholds {thresholds!r} hold a non-numeric acceptance bound",
            "give min_acceptance, p50 and p5 as numbers between 0 and 1",
        ) from exc
    return values[0], values[1], values[2], sorted(set(tasks))


def _frame(rows: list[dict]):
    """The results table; a row without an output count produced no output, and `error` is null when absent."""
    import pandas as pd

    if not isinstance(rows, list):
        raise DraftsyncError(
            f"per-request results of type {type(rows).__name__}", "pass a list of RequestResult.row() dicts"
        )
    present = set().union(*(row.keys() for row in rows)) if rows else set(REQUIRED_COLUMNS)
    missing = [column for column in REQUIRED_COLUMNS if column not in present]
    if missing:
        raise DraftsyncError(
            f"per-request results lack the columns {missing}",
            "pass RequestResult.row() dicts (draftsync.serving.evaluation)",
        )
    columns = list(REQUIRED_COLUMNS) + sorted(present - set(REQUIRED_COLUMNS) - {"error"}) + ["error"]
    frame = pd.DataFrame(rows, columns=columns)
    frame["output_tokens"] = frame["output_tokens"].fillna(0)
    frame["acceptance_rate"] = pd.to_numeric(frame["acceptance_rate"], errors="coerce").astype(float)
    frame["error"] = frame["error"].astype(object).where(frame["error"].notna(), None)
    return frame


def _expectations(
    gxe: Any, frame: Any, min_acceptance: float, p50: float, p5: float, tasks: list[str]
) -> list[dict[str, Any]]:
    """Each gate: stable name, GE expectation, expected in words, the gates a quantile check splits into, fallback."""
    observed_tasks = sorted(plain(t) for t in frame["task"].dropna().unique())

    return [
        {
            "name": "at_least_one_request",
            "expected": ">= 1 request",
            "expectation": gxe.ExpectTableRowCountToBeBetween(min_value=1),
        },
        {
            "name": "every_request_produced_output",
            "expected": "output_tokens >= 1 on every request",
            "expectation": gxe.ExpectColumnValuesToBeBetween(column="output_tokens", min_value=1),
        },
        {
            "name": "no_request_failed",
            "expected": "error is null on every request",
            "expectation": gxe.ExpectColumnValuesToBeNull(column="error"),
        },
        {
            "name": "acceptance_rate_within_0_1",
            "expected": "0 <= acceptance_rate <= 1 where drafted",
            "expectation": gxe.ExpectColumnValuesToBeBetween(column="acceptance_rate", min_value=0, max_value=1),
        },
        {
            "name": "accepted_at_most_draft_tokens",
            "expected": "accepted <= draft_tokens on every request",
            "expectation": gxe.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A="draft_tokens", column_B="accepted", or_equal=True
            ),
        },
        {
            "name": "acceptance_mean_above_min",
            "expected": f"mean per-request acceptance_rate > {min_acceptance}",
            "expectation": gxe.ExpectColumnMeanToBeBetween(
                column="acceptance_rate", min_value=min_acceptance, strict_min=True
            ),
        },
        {
            "name": "acceptance_quantiles",
            "expected": "per-request acceptance_rate quantiles",
            "expectation": gxe.ExpectColumnQuantileValuesToBeBetween(
                column="acceptance_rate",
                allow_relative_error=QUANTILE_INTERPOLATION,
                quantile_ranges={
                    "quantiles": list(QUANTILES.values()),
                    "value_ranges": [[p5, None], [p50, None], [None, None], [None, None]],
                },
            ),
            "gates": [("acceptance_p50_above_min", "p50", p50), ("acceptance_p5_above_min", "p5", p5)],
        },
        {
            "name": "tasks_present",
            "expected": f"tasks == {tasks}",
            "expectation": gxe.ExpectColumnDistinctValuesToEqualSet(column="task", value_set=tasks),
            "fallback": observed_tasks,
        },
    ]


def _observed(result: dict, fallback: Any) -> Any:
    """What GE saw: the aggregate it computed, or for per-row expectations the offending rows by request."""
    if "observed_value" in result and result["observed_value"] is not None:
        value = result["observed_value"]
        if isinstance(value, dict) and "values" in value:  # quantiles, in the order asked for
            return dict(zip(QUANTILES, (plain(v) for v in value["values"]), strict=True))
        return plain(value)
    if "unexpected_count" in result and "element_count" in result:
        rows = result.get("partial_unexpected_index_list") or []  # each with its request id
        offending = [{key: plain(v) for key, v in row.items()} for row in rows]
        return {"unexpected_count": int(result["unexpected_count"]), "unexpected": offending}
    return fallback


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def run_validation_suite(rows: list[dict], thresholds: dict) -> SuiteResult:
    """Run the gates over per-request result rows: each expectation's name, what it saw and its verdict.

    `thresholds`: `min_acceptance`, `p50`, `p5` (strict lower bounds on per-request acceptance rates) and
    `tasks` (the exact set of tasks the requests must cover). Expectations come back in a fixed order.
    """
    min_acceptance, p50, p5, tasks = _check_thresholds(thresholds)
    frame = _frame(rows)

    checks = _expectations(expectation_types(), frame, min_acceptance, p50, p5, tasks)
    outcomes = run_expectations(
        "drafter-validation-gates",
        frame,
        [check["expectation"] for check in checks],
        {"result_format": "SUMMARY", "unexpected_index_column_names": ["request"]},
    )

    expectations: list[SuiteExpectation] = []
    quantiles: dict[str, float | None] = {key: None for key in QUANTILES}
    for check, outcome in zip(checks, outcomes, strict=True):
        config = expectation_of(outcome)
        kwargs = config.kwargs
        columns = kwargs.get("column") or ",".join(kwargs[k] for k in ("column_A", "column_B") if k in kwargs)
        label = f"{config.type}({columns})" if columns else config.type
        observed = _observed(outcome.result or {}, check.get("fallback"))
        passed = bool(outcome.success)
        info = outcome.exception_info or {}
        if info.get("raised_exception"):
            observed, passed = f"error: {info.get('exception_message')}", False
        if "gates" in check:  # one GE quantile expectation, one strict gate per bounded quantile
            values = observed if isinstance(observed, dict) else {}
            quantiles = {key: None if _is_missing(values.get(key)) else values[key] for key in QUANTILES}
            for name, key, bound in check["gates"]:
                value = quantiles[key]
                expectations.append(
                    SuiteExpectation(
                        name,
                        value if values else observed,
                        value is not None and value > bound,
                        f"{key.upper()} of per-request acceptance_rate > {bound}",
                        label,
                    )
                )
            continue
        if _is_missing(observed):
            observed, passed = None, False  # nothing to measure (no request drafted): JSON null, not passed
        expectations.append(SuiteExpectation(check["name"], observed, passed, check["expected"], label))
    return SuiteResult(tuple(expectations), quantiles)
