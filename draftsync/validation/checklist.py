"""The validation checklist's arithmetic: gates, per-request percentiles, the gamma knee, a batch schedule.

Pure functions over per-request results (`serving.evaluation.RequestResult`), so every figure a gate
judges is computed in one place and tested without a model or a Prefect run. Percentiles are taken
over each request's own acceptance rate (accepted / draft tokens of that request), never derived from
a pooled mean: a drafter that is excellent on most requests and useless on some has a good mean and a
bad P5, and P5 is what the production guide's checklist asks about.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from draftsync.serving.evaluation import RequestResult
from draftsync.speculative.methods import METHODS
from draftsync.stats import percentile

Comparison = Literal[">", ">=", "<=", "=="]


@dataclass(frozen=True)
class Gate:
    """One checklist item: what was measured, the threshold, and whether it passed."""

    name: str
    value: float | None
    threshold: float
    comparison: Comparison
    detail: str = ""

    @property
    def passed(self) -> bool:
        if self.value is None or (isinstance(self.value, float) and math.isnan(self.value)):
            return False  # not measured is not passed
        return {
            ">": self.value > self.threshold,
            ">=": self.value >= self.threshold,
            "<=": self.value <= self.threshold,
            "==": self.value == self.threshold,
        }[self.comparison]

    @property
    def reported_value(self) -> float | None:
        """The value as every report shows it: rounded to 4 places, None when not measured."""
        return None if self.value is None or math.isnan(float(self.value)) else round(float(self.value), 4)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "value": self.reported_value, "passed": self.passed}


@dataclass(frozen=True)
class AcceptanceSummary:
    """Pooled acceptance and the spread of per-request acceptance rates."""

    mean: float  # pooled: all accepted / all draft tokens
    mean_acceptance_length: float
    p5: float
    p50: float
    p90: float
    p99: float
    per_position: list[float]  # accepted at position i / drafts, pooled


def _rate_percentile(rates: Sequence[float], q: float) -> float:
    """NaN when no request drafted: a gate reads it as not measured, and the JSON has always shown it so."""
    value = percentile(rates, q)
    return math.nan if value is None else value


def summarize_acceptance(results: Sequence[RequestResult]) -> AcceptanceSummary:
    rates = [r.acceptance_rate for r in results if r.draft_tokens > 0]  # only a request that drafted has a rate
    drafts = sum(r.drafts for r in results)
    draft_tokens = sum(r.draft_tokens for r in results)
    accepted = sum(r.accepted for r in results)
    positions = max((len(r.accepted_per_position) for r in results), default=0)
    per_position = [
        sum(r.accepted_per_position[i] for r in results if i < len(r.accepted_per_position)) / drafts if drafts else 0.0
        for i in range(positions)
    ]
    return AcceptanceSummary(
        mean=accepted / draft_tokens if draft_tokens else math.nan,
        mean_acceptance_length=1.0 + accepted / drafts if drafts else 1.0,
        p5=_rate_percentile(rates, 5),
        p50=_rate_percentile(rates, 50),
        p90=_rate_percentile(rates, 90),
        p99=_rate_percentile(rates, 99),
        per_position=per_position,
    )


def pooled_tpot_ms(results: Sequence[RequestResult]) -> float:
    """Decode time over decoded tokens across requests (each request's first token is its prefill)."""
    tokens = sum(r.output_tokens - 1 for r in results if r.output_tokens > 1)
    seconds = sum(r.seconds - r.ttft_s for r in results if r.output_tokens > 1)
    return 1000.0 * seconds / tokens if tokens else math.nan


def acceptance_rate_lower_bound(results: Sequence[RequestResult], z: float = 1.645) -> float:
    """The pooled acceptance rate less z standard errors of the per-request rates (one-sided 95 %).

    Requests, not tokens, are the independent samples: tokens of one request are accepted or not together.
    With fewer than two drafted requests there is no spread to measure and the bound is the rate itself."""
    summary = summarize_acceptance(results)
    rates = [r.acceptance_rate for r in results if r.draft_tokens > 0]
    if len(rates) < 2 or math.isnan(summary.mean):
        return summary.mean
    return summary.mean - z * statistics.stdev(rates) / math.sqrt(len(rates))


def gamma_knee(sweep: Sequence[dict], tolerance: float = 0.02, min_acceptance: float | None = None) -> int:
    """The gamma with the best (lowest) TPOT; gammas within `tolerance` of the best count as tied and the
    smallest of them wins: a larger gamma costs drafter work for nothing measurable.

    With `min_acceptance`, only gammas whose acceptance rate clears it compete. Acceptance per draft token
    falls as gamma grows, and the gates and the live fallback judge that rate: a knee whose rate sits under
    the threshold would fail validation, or be served and then fall back. The sweep measures a subset of
    the validation requests, so a rate that clears the threshold by less than its sampling error is no
    promise: where a row has `acceptance_rate_lower` (see `acceptance_rate_lower_bound`), that bound must
    clear it. When no gamma's bound does but some rates do, speed no longer decides: the knee is the gamma
    most likely to clear the gate (the highest bound, then the highest rate): the faster of two gammas that
    clear only by luck is the likelier to fail on the whole validation set (docs/VALIDATION.md). When no rate
    clears, every gamma competes (and the gates will say so).

    A sweep that measured no TPOT at all (each of its requests ended at the target's EOS after one token) says
    nothing about speed: the knee is then the smallest gamma, the cheapest to be wrong about."""
    if not sweep:
        raise ValueError("the gamma sweep is empty")
    measured = [row for row in sweep if row.get("tpot_ms") is not None and not math.isnan(row["tpot_ms"])]
    if not measured:
        return min(int(row["gamma"]) for row in sweep)
    if min_acceptance is not None:

        def bound(row: dict) -> float:
            return row.get("acceptance_rate_lower", row.get("acceptance_rate", 0.0))

        surely = [row for row in measured if bound(row) > min_acceptance]
        clearing = [row for row in measured if row.get("acceptance_rate", 0.0) > min_acceptance]
        if not surely and clearing:
            return int(max(clearing, key=lambda row: (bound(row), row["acceptance_rate"], -row["gamma"]))["gamma"])
        measured = surely or measured
    best = min(row["tpot_ms"] for row in measured)
    return min(int(row["gamma"]) for row in measured if row["tpot_ms"] <= best * (1 + tolerance))


# Drafter methods vLLM serves without `num_speculative_tokens_per_batch_size`, and why: validation makes them
# no schedule, since the renderer (serving/vllm_args.py) refuses one and a rollout would then fail.
def unscheduled_reason(method: str) -> str | None:
    """Why vLLM serves `method` without a per-batch-size schedule (a method of one fixed gamma: Medusa's heads, a
    block drafter), None where it takes one."""
    if not METHODS[method].fixed_heads:
        return None
    return (
        f"vLLM's {method} drafts exactly num_speculative_tokens at every batch size, so it takes no per-batch-size "
        "schedule; it is served at the knee"
    )


def speculation_schedule(
    tpot_by_batch: dict[int, dict[int, float]], tolerance: float = 0.02
) -> list[tuple[int, int, int]]:
    """vLLM's `num_speculative_tokens_per_batch_size` from stress data: {batch size: {gamma: TPOT ms}}.

    Each measured batch size gets its knee (gamma 0, speculation off, when plain decoding is fastest),
    and covers the batch sizes from itself up to the next measured one minus one; neighbours with the
    same gamma merge. The last range ends at the largest measured batch size.
    """
    return schedule_ranges(
        {
            size: gamma_knee([{"gamma": g, "tpot_ms": t} for g, t in tpot_by_batch[size].items()], tolerance)
            for size in tpot_by_batch
        }
    )


def schedule_k(schedule: Sequence[Sequence[int]], batch_size: int) -> int:
    """The k a [(first, last, k)] schedule gives `batch_size`."""
    return next(k for first, last, k in schedule if first <= batch_size <= last)


def schedule_ranges(k_by_size: dict[int, int]) -> list[tuple[int, int, int]]:
    """[(first, last, k)] from one k per measured batch size: each covers the sizes up to the next measured one
    minus one (the first from 1, the last to itself), and neighbours with the same k merge."""
    sizes = sorted(k_by_size)
    ranges: list[tuple[int, int, int]] = []
    for i, size in enumerate(sizes):
        k = k_by_size[size]
        end = sizes[i + 1] - 1 if i + 1 < len(sizes) else size
        start = 1 if i == 0 else size
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], end, k)
        else:
            ranges.append((start, end, k))
    return ranges


def acceptance_by_length(results: Sequence[RequestResult], edges: Sequence[int]) -> list[dict[str, Any]]:
    """Pooled acceptance per output-length bucket [edges[i], edges[i+1]); the last bucket is open."""
    buckets = []
    bounds = list(edges) + [math.inf]
    for low, high in zip(bounds[:-1], bounds[1:], strict=False):
        members = [r for r in results if low <= r.output_tokens < high]
        draft_tokens = sum(r.draft_tokens for r in members)
        buckets.append(
            {
                "min_tokens": low,
                "max_tokens": None if high == math.inf else high - 1,
                "requests": len(members),
                "acceptance_rate": round(sum(r.accepted for r in members) / draft_tokens, 4) if draft_tokens else None,
            }
        )
    return buckets


def identical_outputs_share(first: Sequence[RequestResult], second: Sequence[RequestResult]) -> float:
    """Share of requests whose outputs are the same token for token (speculation on vs off at T=0)."""
    if not first or len(first) != len(second):
        return math.nan
    return sum(a.token_ids == b.token_ids for a, b in zip(first, second, strict=True)) / len(first)
