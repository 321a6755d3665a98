"""The weekly acceptance summary of one deployment: pure functions over stored sample rows.

acceptance rate = accepted / draft_tokens; mean acceptance length = 1 + accepted / drafts;
per-position rate = accepted_per_position[i] / drafts (vLLM's definitions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from draftsync.stats import percentile

if TYPE_CHECKING:  # for annotations only: summaries load without SQLAlchemy
    from draftsync.monitors.rollups import HourlyRow

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


class SampleRow(Protocol):
    """What a summary needs from a sample; `store.Sample` rows fit."""

    deployment: str
    ts: datetime
    interval_start: datetime
    target_name: str
    target_version: int
    drafter_version: int | None
    gamma: int
    drafts: int
    draft_tokens: int
    accepted: int
    accepted_per_position: list[int]
    reset: bool


@dataclass(frozen=True)
class IntervalPoint:
    """Acceptance over one scrape interval that saw draft tokens."""

    start: datetime
    end: datetime
    drafts: int
    draft_tokens: int
    accepted: int

    @property
    def rate(self) -> float:
        return self.accepted / self.draft_tokens

    @property
    def midpoint(self) -> datetime:
        return self.start + (self.end - self.start) / 2


@dataclass(frozen=True)
class DeploymentSummary:
    """Acceptance of one deployment over [start, end]; rates are None when no draft token was seen."""

    deployment: str
    start: datetime
    end: datetime
    intervals: int
    drafts: int
    draft_tokens: int
    accepted: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    per_position_rate: list[float]
    interval_p5: float | None
    interval_p50: float | None
    slope_per_day: float | None
    daily: list[tuple[datetime, float]]
    points: list[IntervalPoint] = field(repr=False)
    resets: int = 0
    target_name: str | None = None
    target_version: int | None = None
    drafter_version: int | None = None
    gamma: int | None = None
    bucket: timedelta = DAY

    @property
    def start_rate(self) -> float | None:
        """Acceptance of the first day with traffic: where the week's trend starts."""
        return self.daily[0][1] if self.daily else None

    @property
    def end_rate(self) -> float | None:
        """Acceptance of the last day with traffic: where the week's trend ends."""
        return self.daily[-1][1] if self.daily else None


def slope_per_day(points: Sequence[tuple[datetime, float]]) -> float | None:
    """Least-squares slope of value against time, in value per day; None with fewer than two times."""
    if len(points) < 2:
        return None
    origin = points[0][0]
    xs = [(t - origin) / DAY for t, _ in points]
    ys = [v for _, v in points]
    mean_x = sum(xs) / len(xs)
    mean_y = sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def slope_t_statistic(points: Sequence[tuple[datetime, float]]) -> float | None:
    """The least-squares slope over its standard error: how many standard errors the trend is from flat.

    None with fewer than three points or no spread in time; +-inf when the points lie exactly on a line."""
    if len(points) < 3:
        return None
    origin = points[0][0]
    xs = [(t - origin) / DAY for t, _ in points]
    ys = [v for _, v in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    residual = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in zip(xs, ys, strict=True)) / (len(xs) - 2)
    if residual == 0:
        return math.copysign(math.inf, slope) if slope else 0.0
    return slope / math.sqrt(residual / spread)


def slope_text(value: float | None) -> str:
    """A slope for people: signed, three decimals, and no "-0.000"."""
    if value is None:
        return "n/a"
    return f"{0.0 if abs(value) < 0.0005 else value:+.3f}/day"


def _daily(points: Sequence[IntervalPoint], start: datetime, bucket: timedelta) -> list[tuple[datetime, float]]:
    """Pooled acceptance per bucket counted from `start` (so a week starting at noon has 7 full days)."""
    sums: dict[int, list[int]] = {}
    for point in points:
        index = max(0, math.floor((point.end - start) / bucket - 1e-9))
        acc = sums.setdefault(index, [0, 0])
        acc[0] += point.accepted
        acc[1] += point.draft_tokens
    return [(start + index * bucket, acc[0] / acc[1]) for index, acc in sorted(sums.items())]


def summarize(
    samples: Sequence[SampleRow],
    start: datetime,
    end: datetime,
    *,
    deployment: str | None = None,
    bucket: timedelta = DAY,
) -> DeploymentSummary:
    """Summarize the samples of one deployment over [start, end] (`bucket` sizes the daily series)."""
    rows = sorted(samples, key=lambda s: s.ts)
    name = _one_deployment(rows, deployment, "summarize")
    points = [
        IntervalPoint(s.interval_start, s.ts, s.drafts, s.draft_tokens, s.accepted) for s in rows if s.draft_tokens > 0
    ]
    return _summary(name, start, end, bucket, rows, points, intervals=len(rows), resets=sum(1 for s in rows if s.reset))


def summarize_hourly(
    rows: Sequence[HourlyRow],
    start: datetime,
    end: datetime,
    *,
    deployment: str | None = None,
    bucket: timedelta = DAY,
) -> DeploymentSummary:
    """Summarize one deployment from its hourly rollups (`store.acceptance.rollup_window`): a week costs 168 rows.

    The sums (acceptance, mean acceptance length, per position, TPOT, restarts, the pair served last)
    equal `summarize` over the same samples; the points, and so the spread (P5, P50), the slope, the chart
    and the stale rule's "last intervals", are per hour rather than per scrape interval. The daily series
    is exact when `start` is on a whole hour (a report week is); otherwise an hour that straddles a day
    boundary counts in the day it ends in.
    """
    ordered = sorted(rows, key=lambda r: (r.hour, r.last_ts or r.hour))
    name = _one_deployment(ordered, deployment, "summarize_hourly")
    pooled: dict[datetime, list[int]] = {}
    for row in ordered:
        if row.draft_tokens > 0:
            counts = pooled.setdefault(row.hour, [0, 0, 0])
            counts[0] += row.drafts
            counts[1] += row.draft_tokens
            counts[2] += row.accepted
    points = [
        IntervalPoint(max(hour, start), min(hour + HOUR, end), drafts, draft_tokens, accepted)
        for hour, (drafts, draft_tokens, accepted) in pooled.items()
    ]
    return _summary(
        name,
        start,
        end,
        bucket,
        ordered,
        points,
        intervals=sum(r.intervals for r in ordered),
        resets=sum(r.resets for r in ordered),
    )


def _one_deployment(rows: Sequence, deployment: str | None, caller: str) -> str:
    names = {r.deployment for r in rows}
    if len(names) > 1:
        raise ValueError(f"{caller}() takes the rows of one deployment, got {sorted(names)}")
    return deployment or (rows[0].deployment if rows else "")


def _summary(
    name: str,
    start: datetime,
    end: datetime,
    bucket: timedelta,
    rows: Sequence[SampleRow] | Sequence[HourlyRow],
    points: list[IntervalPoint],
    *,
    intervals: int,
    resets: int,
) -> DeploymentSummary:
    """The parts of a summary that sample rows and rollup rows share (`rows` oldest first)."""
    drafts = sum(r.drafts for r in rows)
    draft_tokens = sum(r.draft_tokens for r in rows)
    accepted = sum(r.accepted for r in rows)
    width = max((len(r.accepted_per_position or []) for r in rows), default=0)
    per_position = [0] * width
    for r in rows:
        for i, count in enumerate(r.accepted_per_position or []):
            per_position[i] += count
    rates = [p.rate for p in points]
    last = rows[-1] if rows else None
    return DeploymentSummary(
        deployment=name,
        start=start,
        end=end,
        intervals=intervals,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted=accepted,
        acceptance_rate=accepted / draft_tokens if draft_tokens else None,
        mean_acceptance_length=1 + accepted / drafts if drafts else None,
        per_position_rate=[count / drafts for count in per_position] if drafts else [],
        interval_p5=percentile(rates, 5),
        interval_p50=percentile(rates, 50),
        slope_per_day=slope_per_day([(p.midpoint, p.rate) for p in points]),
        daily=_daily(points, start, bucket),
        points=points,
        resets=resets,
        target_name=last.target_name if last else None,
        target_version=last.target_version if last else None,
        drafter_version=last.drafter_version if last else None,
        gamma=last.gamma if last else None,
        bucket=bucket,
    )


@dataclass(frozen=True)
class DomainAcceptance:
    """One client domain's acceptance over the captured requests of a week: its share of them, the pooled rate and
    the spread of the per-request rates (requests that drafted nothing count in the share only)."""

    domain: str
    requests: int
    share: float
    acceptance_rate: float | None
    p5: float | None
    p50: float | None


UNLABELLED = "(no label)"


class RequestRow(Protocol):
    """One request's acceptance as the monitor store books it (`RequestAcceptance`)."""

    domain: str | None
    draft_tokens: int
    accepted: int


def domain_acceptance(rows: Sequence[RequestRow]) -> list[DomainAcceptance]:
    """Per domain label, from booked requests, worst rate first."""
    by_domain: dict[str, list[RequestRow]] = {}
    for row in rows:
        by_domain.setdefault(row.domain or UNLABELLED, []).append(row)
    out = []
    for domain, requests in by_domain.items():
        drafted = [r for r in requests if r.draft_tokens]
        rates = [r.accepted / r.draft_tokens for r in drafted]
        total = sum(r.draft_tokens for r in drafted)
        out.append(
            DomainAcceptance(
                domain=domain,
                requests=len(requests),
                share=len(requests) / len(rows),
                acceptance_rate=sum(r.accepted for r in drafted) / total if total else None,
                p5=percentile(rates, 5),
                p50=percentile(rates, 50),
            )
        )
    return sorted(out, key=lambda d: (d.acceptance_rate is None, d.acceptance_rate or 0.0))
