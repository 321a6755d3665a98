"""Staleness rules: turn a deployment's acceptance summary and lineage into findings and actions.

Live acceptance below `mismatch` suggests the drafter no longer fits the traffic or the target
(fall back to plain decoding); below `stale` over the last `sustained_intervals` intervals, pooled, it
is stale (fall back and retrain). Pooled, not interval by interval: with little traffic per interval one
lucky interval would otherwise veto a drop that the window as a whole shows. A drafter trained for another
target version is never right to serve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from draftsync.monitors.trends import DeploymentSummary, SampleRow, slope_t_statistic, slope_text

if TYPE_CHECKING:
    from draftsync.settings import Settings

Severity = Literal["info", "warning", "critical"]
Action = Literal["none", "fallback", "retrain", "fallback+retrain"]
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class Thresholds:
    """Rule parameters; `from_settings` takes the two acceptance thresholds from Settings."""

    mismatch: float = 0.60
    stale: float = 0.50
    min_draft_tokens: int = 200  # below this the week says nothing about acceptance
    sustained_intervals: int = 3  # "sustained" = this many most recent intervals with traffic
    min_position_rate: float = 0.10  # a draft position accepted less often than this is wasted work
    trend_drop_per_day: float = 0.02  # a downward trend steeper than this per day ...
    trend_t: float = 3.0  # ... and this many standard errors from flat is a significant decline
    baseline_sigmas: float = 3.0  # acceptance this many baseline deviations under its baseline mean is a regression
    min_baseline_points: int = 6  # a first week with fewer rated intervals gives no baseline

    @classmethod
    def from_settings(cls, settings: Settings) -> Thresholds:
        return cls(mismatch=settings.mismatch_threshold, stale=settings.stale_threshold)


@dataclass(frozen=True)
class Baseline:
    """A drafter's first week after rollout: its acceptance and the spread of its interval rates.

    Thresholds from its own variability: a deployment whose traffic always sat at 0.65 +- 0.02 has
    regressed at 0.58, long before the global 0.50 stale line; one that swings +-0.15 has not."""

    acceptance_rate: float
    std: float
    points: int
    start: datetime
    end: datetime

    @classmethod
    def from_summary(cls, summary: DeploymentSummary) -> Baseline | None:
        rates = [p.rate for p in summary.points]
        if summary.acceptance_rate is None or len(rates) < 2:
            return None
        mean = sum(rates) / len(rates)
        std = math.sqrt(sum((r - mean) ** 2 for r in rates) / (len(rates) - 1))
        return cls(summary.acceptance_rate, std, len(rates), summary.start, summary.end)

    def floor(self, sigmas: float) -> float:
        return self.acceptance_rate - sigmas * self.std


@dataclass(frozen=True)
class Finding:
    """One thing the weekly review found about a deployment, and what should be done about it."""

    deployment: str
    rule: str  # 'stale' | 'mismatch' | 'trend' | 'baseline' | 'lineage' | 'gamma' | 'no_data' | 'prediction'
    severity: Severity
    value: float
    message: str
    action: Action
    higher_is_worse: bool = False

    @property
    def key(self) -> str:
        """What alerts are deduplicated on: the same rule firing again for the same deployment."""
        return f"{self.deployment}:{self.rule}"


def recent_acceptance(summary: DeploymentSummary, intervals: int) -> tuple[float | None, list[float]]:
    """Pooled acceptance of the last `intervals` intervals with traffic, and their own rates."""
    recent = summary.points[-intervals:] if intervals > 0 else []
    tokens = sum(p.draft_tokens for p in recent)
    pooled = sum(p.accepted for p in recent) / tokens if tokens else None
    return pooled, [p.rate for p in recent]


def fallback_due(
    samples: Sequence[SampleRow], threshold: float, min_draft_tokens: int
) -> tuple[bool, float | None, int]:
    """(due, pooled acceptance, draft tokens) over `samples`: the live acceptance guard's decision.

    Pooled, not per interval: one quiet interval must neither trigger nor veto it; too few draft tokens
    decide nothing."""
    draft_tokens = sum(s.draft_tokens for s in samples)
    if draft_tokens == 0:
        return False, None, 0
    rate = sum(s.accepted for s in samples) / draft_tokens
    return draft_tokens >= min_draft_tokens and rate < threshold, rate, draft_tokens


def suggested_gamma(per_position_rate: list[float], min_rate: float) -> int:
    """Draft only as far as positions still get accepted at least `min_rate` of the time (at least 1)."""
    useful = 0
    for rate in per_position_rate:
        if rate < min_rate:
            break
        useful += 1
    return max(1, useful)


def evaluate(
    summary: DeploymentSummary,
    served_target_version: int | None,
    drafter_trained_for_version: int | None,
    thresholds: Thresholds = Thresholds(),
    baseline: Baseline | None = None,
) -> list[Finding]:
    """Apply the rules; the most severe finding comes first. No finding means healthy.
    Long: one rule after another, each beside the threshold it reads."""
    name = summary.deployment
    findings: list[Finding] = []

    if (
        served_target_version is not None
        and drafter_trained_for_version is not None
        and int(served_target_version) != int(drafter_trained_for_version)
    ):
        gap = abs(int(served_target_version) - int(drafter_trained_for_version))
        findings.append(
            Finding(
                name,
                "lineage",
                "critical",
                float(gap),
                f"{name}: lineage mismatch: the drafter was trained for target version "
                f"{drafter_trained_for_version} but version {served_target_version} is served; "
                "train a drafter for the served version",
                "retrain",
                higher_is_worse=True,
            )
        )

    if summary.acceptance_rate is None or summary.draft_tokens < thresholds.min_draft_tokens:
        findings.append(
            Finding(
                name,
                "no_data",
                "info",
                float(summary.draft_tokens),
                f"{name}: only {summary.draft_tokens} draft tokens between {summary.start:%Y-%m-%d %H:%M} and "
                f"{summary.end:%Y-%m-%d %H:%M} UTC (need {thresholds.min_draft_tokens}); acceptance not judged",
                "none",
            )
        )
        return _ordered(findings)

    week = summary.acceptance_rate
    recent, recent_rates = recent_acceptance(summary, thresholds.sustained_intervals)
    sustained = len(recent_rates) >= thresholds.sustained_intervals and recent is not None and recent < thresholds.stale
    trend = _trend_text(summary)
    if sustained and recent is not None:
        findings.append(
            Finding(
                name,
                "stale",
                "critical",
                recent,
                f"{name}: drafter stale: acceptance {recent:.2f} over the last {len(recent_rates)} intervals, "
                f"below the stale threshold {thresholds.stale:.2f} (week {week:.2f}; {trend}); "
                "fall back to plain decoding and retrain the drafter",
                "fallback+retrain",
            )
        )
    else:
        live = min(week, recent) if recent is not None else week
        if live < thresholds.mismatch:
            findings.append(
                Finding(
                    name,
                    "mismatch",
                    "warning",
                    live,
                    f"{name}: mismatch suspected: acceptance {live:.2f} is below {thresholds.mismatch:.2f} "
                    f"(week {week:.2f}, last intervals {_fmt(recent)}; {trend}); "
                    "speculation is falling back to plain decoding",
                    "fallback",
                )
            )

    if not any(f.rule in ("stale", "mismatch") for f in findings):
        findings.extend(_decline(summary, week, thresholds, baseline))

    gamma = summary.gamma or len(summary.per_position_rate)
    rates = summary.per_position_rate[:gamma]
    if rates:
        best = suggested_gamma(rates, thresholds.min_position_rate)
        if best < len(rates):
            findings.append(
                Finding(
                    name,
                    "gamma",
                    "info",
                    rates[-1],
                    f"{name}: gamma {len(rates)} too large: positions {best + 1}..{len(rates)} are accepted in "
                    f"{_rates_text(rates[best:])} of drafts (under {thresholds.min_position_rate:.2f}); "
                    f"suggested gamma {best}",
                    "none",
                )
            )
    return _ordered(findings)


def _decline(
    summary: DeploymentSummary, week: float, thresholds: Thresholds, baseline: Baseline | None
) -> list[Finding]:
    """Early warnings above the fixed thresholds: a significant downward trend, a drop under the baseline."""
    name, found = summary.deployment, []
    slope = summary.slope_per_day
    t = slope_t_statistic([(p.midpoint, p.rate) for p in summary.points])
    if slope is not None and t is not None and slope < -thresholds.trend_drop_per_day and t < -thresholds.trend_t:
        found.append(
            Finding(
                name,
                "trend",
                "warning",
                slope,
                f"{name}: acceptance is declining {slope:+.3f} per day ({abs(t):.1f} standard errors from flat; "
                f"week {week:.2f}); watch it, and retrain if the target or the traffic changed",
                "none",
            )
        )
    if baseline is not None and baseline.points >= thresholds.min_baseline_points:
        floor = baseline.floor(thresholds.baseline_sigmas)
        if week < floor:
            found.append(
                Finding(
                    name,
                    "baseline",
                    "warning",
                    week,
                    f"{name}: acceptance {week:.2f} is under its baseline {baseline.acceptance_rate:.2f} "
                    f"(+-{baseline.std:.2f}, the first week after rollout, {baseline.start:%Y-%m-%d}) by more than "
                    f"{thresholds.baseline_sigmas:g} deviations (floor {floor:.2f})",
                    "none",
                )
            )
    return found


def worst(findings: list[Finding]) -> Finding | None:
    """The finding that names a report's state."""
    return max(findings, key=lambda f: SEVERITY_RANK[f.severity], default=None)


def _ordered(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: -SEVERITY_RANK[f.severity])


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _rates_text(rates: list[float]) -> str:
    return ", ".join(f"{r:.2f}" for r in rates)


def _trend_text(summary: DeploymentSummary) -> str:
    if summary.start_rate is None or summary.end_rate is None:
        return "no daily trend"
    slope = "" if summary.slope_per_day is None else f", {slope_text(summary.slope_per_day)}"
    return f"daily {summary.start_rate:.2f} -> {summary.end_rate:.2f}{slope}"
