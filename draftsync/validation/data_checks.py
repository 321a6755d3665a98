"""Data checks on a hidden-state dataset, run before a drafter trains on it (Great Expectations 1.x).

A drafter trained on the wrong data still trains: NaN states, empty sequences, ids beyond the
vocabulary, states of another target's width or a task mix that drifted from the declared one only
show up later as poor acceptance. Each check is a named expectation over one row per sequence
(`ShardDataset.summary_rows()`), so a failure reads as the expectation and the value it observed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from draftsync.errors import DraftsyncError
from draftsync.validation.expectations import expectation_of, expectation_types, plain, run_expectations

DEFAULT_TOLERANCE = 0.05  # each task's share within 5 points of the declared mix


@dataclass
class ExpectationOutcome:
    """One expectation: its name (GE type and column), what it guards, what it saw and what it wanted."""

    name: str
    check: str
    observed: Any
    expected: str
    passed: bool


@dataclass
class DataCheckReport:
    sequences: int
    outcomes: list[ExpectationOutcome] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outcomes)

    @property
    def failures(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.passed]

    def to_dict(self) -> dict:
        return {"sequences": self.sequences, "passed": self.passed, "outcomes": [asdict(o) for o in self.outcomes]}


class DataCheckError(DraftsyncError):
    """Data checks failed: the message names each failed expectation, `report` holds every outcome."""

    report: DataCheckReport | None = None


def _config_value(target_config: Any, key: str) -> int:
    value = target_config.get(key) if isinstance(target_config, dict) else getattr(target_config, key, None)
    if value is None:
        raise DraftsyncError(
            f"the target config has no {key}", "pass the target's transformers config or its config.json"
        )
    return int(value)


def _expectations(
    gxe: Any, frame: Any, task_mix: dict[str, float], tolerance: float, hidden_size: int, vocab_size: int, has_aux: bool
) -> list[tuple[str, Any, str, Any]]:
    """(what it guards, expectation, expected in words, observed value when GE reports none)."""
    total = sum(task_mix.values())
    declared = {task: share / total for task, share in sorted(task_mix.items()) if share > 0}
    distinct = {
        column: sorted(plain(v) for v in frame[column].unique()) for column in ("task", "final_width", "aux_width")
    }
    checks = [
        ("at least one sequence", gxe.ExpectTableRowCountToBeBetween(min_value=1), ">= 1", None),
        (
            "only declared tasks",
            gxe.ExpectColumnDistinctValuesToBeInSet(column="task", value_set=sorted(declared)),
            f"within {sorted(declared)}",
            distinct["task"],
        ),
    ]
    for task, share in declared.items():
        low, high = max(0.0, share - tolerance), min(1.0, share + tolerance)
        checks.append(
            (
                f"share of task {task!r}",
                gxe.ExpectColumnMeanToBeBetween(column=_share_column(task), min_value=low, max_value=high),
                f"{share:.3f} +- {tolerance}",
                None,
            )
        )
    checks += [
        ("no empty sequence", gxe.ExpectColumnMinToBeBetween(column="length", min_value=2), "min length >= 2", None),
        (
            "every sequence has a training target",
            gxe.ExpectColumnMinToBeBetween(column="loss_tokens", min_value=1),
            "min loss tokens >= 1",
            None,
        ),
        (
            "finite hidden states",
            gxe.ExpectColumnSumToBeBetween(column="nonfinite", min_value=0, max_value=0),
            "0 non-finite values",
            None,
        ),
        (
            "token ids inside the vocabulary",
            gxe.ExpectColumnMaxToBeBetween(column="max_token_id", max_value=vocab_size - 1),
            f"max id <= {vocab_size - 1}",
            None,
        ),
        (
            "final state width is the target's hidden size",
            gxe.ExpectColumnDistinctValuesToEqualSet(column="final_width", value_set=[hidden_size]),
            f"{[hidden_size]}",
            distinct["final_width"],
        ),
    ]
    if has_aux:
        checks.append(
            (
                "aux state width is three hidden sizes",
                gxe.ExpectColumnDistinctValuesToEqualSet(column="aux_width", value_set=[3 * hidden_size]),
                f"{[3 * hidden_size]}",
                distinct["aux_width"],
            )
        )
    return checks


def _share_column(task: str) -> str:
    """`is_<task>`: a 0/1 column per declared task (tasks are plain names; anything else is escaped)."""
    return "is_" + "".join(c if c.isalnum() or c == "_" else f"-{ord(c):x}-" for c in task)


def _frame(rows: list[dict], task_mix: dict[str, float]):
    import pandas as pd

    columns = ["task", "length", "loss_tokens", "max_token_id", "nonfinite", "aux_width", "final_width"]
    frame = pd.DataFrame(rows, columns=columns)
    for task, share in sorted(task_mix.items()):
        if share > 0:
            frame[_share_column(task)] = (frame["task"] == task).astype(float)  # its mean is the task's share
    return frame


def run_data_checks(
    dataset: Any, target_config: Any, task_mix: dict[str, float], tolerance: float = DEFAULT_TOLERANCE
) -> DataCheckReport:
    """Validate a shard dataset (a `ShardDataset` or its directory) against its target and declared task mix.

    Returns the report when every expectation holds; otherwise raises DraftsyncError naming each failed
    expectation and its observed value (a DataCheckError: the report is attached as `error.report`).
    """
    from draftsync.speculative.data.shard_reader import ShardDataset

    if not task_mix or sum(task_mix.values()) <= 0:
        raise DraftsyncError(f"task mix {task_mix!r} has no positive share", 'declare shares, e.g. {"code": 1.0}')
    if isinstance(dataset, (str, Path)):
        dataset = ShardDataset(dataset)
    hidden_size = _config_value(target_config, "hidden_size")
    vocab_size = _config_value(target_config, "vocab_size")
    frame = _frame(dataset.summary_rows(), task_mix)

    checks = _expectations(expectation_types(), frame, task_mix, tolerance, hidden_size, vocab_size, dataset.has_aux)
    outcomes = run_expectations(
        "hidden-state-dataset", frame, [check[1] for check in checks], {"result_format": "SUMMARY"}
    )

    report = DataCheckReport(sequences=len(frame))
    for (check, _expectation, expected, observed_fallback), outcome in zip(checks, outcomes, strict=True):
        config = expectation_of(outcome)
        kwargs = config.kwargs
        name = f"{config.type}({kwargs['column']})" if "column" in kwargs else config.type
        observed = plain((outcome.result or {}).get("observed_value"))
        if observed is None:
            observed = observed_fallback
        raised = (outcome.exception_info or {}).get("raised_exception")
        if raised:
            observed = f"error: {(outcome.exception_info or {}).get('exception_message')}"
        report.outcomes.append(ExpectationOutcome(name, check, observed, expected, bool(outcome.success)))
    if not report.passed:
        lines = "; ".join(
            f"{o.name} [{o.check}] observed {o.observed!r}, expected {o.expected}" for o in report.failures
        )
        error = DataCheckError(
            f"data checks failed on {getattr(dataset, 'path', 'the dataset')}: {lines}",
            "rebuild the dataset from the right target and task mix (or fix the declared draftsync.task_mix)",
        )
        error.report = report
        raise error
    return report
