"""Hourly rollups: which hour a sample counts in, how samples sum into an hourly row, and how a window is read.

A rollup row keyed `hour` sums the samples whose interval ends in (hour, hour + 1 h], the store's window
convention. A window that starts or ends inside an hour reads its whole hours from the rollup table and
sums its partial edge hours from the samples (`split_window`, `summed_samples`), so the sums are exact for
any window. `hourly_rows` is the same arithmetic in Python, for samples already at hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from draftsync.monitors.tables import NO_DRAFTER, HourlyRollup, Sample, as_utc

HOUR = timedelta(hours=1)


def rollup_hour(ts: datetime) -> datetime:
    """The hour whose rollup row counts a sample stamped `ts`: rows cover (hour, hour + 1 h], like windows."""
    ts = as_utc(ts)
    floor = ts.replace(minute=0, second=0, microsecond=0)
    return floor - HOUR if floor == ts else floor


def _ceil_hour(moment: datetime) -> datetime:
    floor = moment.replace(minute=0, second=0, microsecond=0)
    return floor if floor == moment else floor + HOUR


@dataclass
class HourlyRow:
    """What the weekly report reads per deployment and hour: sums over the samples of one served pair.

    `drafter_version` is None when speculation was off. A row at the edge of a window that does not
    start or end on a whole hour sums only the samples inside the window.
    """

    deployment: str
    hour: datetime
    target_name: str
    target_version: int
    drafter_version: int | None
    gamma: int
    intervals: int = 0
    resets: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    generation_tokens: int | None = None
    tpot_sum: float | None = None
    tpot_count: int | None = None
    last_ts: datetime | None = None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None


def add_sample(total, sample) -> None:
    """Add one sample's counters to a rollup (`HourlyRollup` or `HourlyRow`); None counters stay unknown."""
    total.intervals += 1
    total.resets += 1 if sample.reset else 0
    total.drafts += sample.drafts
    total.draft_tokens += sample.draft_tokens
    total.accepted += sample.accepted
    per_position = list(total.accepted_per_position or [])  # a new list, so the ORM sees the change
    for i, count in enumerate(sample.accepted_per_position or []):
        if i < len(per_position):
            per_position[i] += count
        else:
            per_position.append(count)
    total.accepted_per_position = per_position
    for name in ("generation_tokens", "tpot_sum", "tpot_count"):
        value = getattr(sample, name)
        if value is not None:
            current = getattr(total, name)
            setattr(total, name, value if current is None else current + value)
    ts = as_utc(sample.ts)
    total.last_ts = ts if total.last_ts is None else max(as_utc(total.last_ts), ts)


def hourly_rows(samples: Iterable) -> list[HourlyRow]:
    """Sum sample-like rows into hourly rows, the way `record_scrape` keeps them (oldest hour first)."""
    rows: dict[tuple, HourlyRow] = {}
    for sample in samples:
        key = (
            sample.deployment,
            rollup_hour(sample.ts),
            sample.target_name,
            int(sample.target_version),
            None if sample.drafter_version in (None, NO_DRAFTER) else int(sample.drafter_version),
            int(sample.gamma),
        )
        row = rows.get(key)
        if row is None:
            row = rows[key] = HourlyRow(*key)
        add_sample(row, sample)
    return sorted(rows.values(), key=lambda r: (r.deployment, r.hour, r.last_ts))


def split_window(since: datetime, until: datetime) -> tuple[tuple[datetime, datetime] | None, list]:
    """(first, end) of the whole rollup hours inside (since, until], and the partial edges to read from samples."""
    first, end = _ceil_hour(since), until.replace(minute=0, second=0, microsecond=0)
    if first > end:  # both ends inside one hour
        return None, [(since, until)]
    edges = [(low, high) for low, high in ((since, first), (end, until)) if low < high]  # each inside one hour
    return ((first, end) if first < end else None), edges


def rolled_up_between(low: datetime, high: datetime):
    """Deployments with a rollup row for an hour touching (low, high]: the only ones with samples there."""
    return (
        select(HourlyRollup.deployment)
        .where(
            HourlyRollup.hour >= rollup_hour(low + timedelta(microseconds=1)), HourlyRollup.hour <= rollup_hour(high)
        )
        .distinct()
    )


def summed_samples(session: Session, low: datetime, high: datetime, deployments) -> list[HourlyRow]:
    """The samples in (low, high], a part of one rollup hour, summed in SQL per deployment and served pair."""
    window = (Sample.deployment.in_(deployments), Sample.ts > low, Sample.ts <= high)
    width = session.scalar(select(func.max(func.json_array_length(Sample.accepted_per_position))).where(*window)) or 0
    pair = (Sample.deployment, Sample.target_name, Sample.target_version, Sample.drafter_version, Sample.gamma)
    query = (
        select(
            *pair,
            func.count(),
            func.sum(case((Sample.reset, 1), else_=0)),
            *(
                func.sum(getattr(Sample, name))
                for name in ("drafts", "draft_tokens", "accepted", "generation_tokens", "tpot_sum", "tpot_count")
            ),
            func.max(Sample.ts),
            *(func.sum(Sample.accepted_per_position[i].as_integer()) for i in range(width)),
        )
        .where(*window)
        .group_by(*pair)
    )
    hour = rollup_hour(high)
    rows = []
    for found in session.execute(query):
        (
            deployment,
            target_name,
            target_version,
            drafter_version,
            gamma,
            intervals,
            resets,
            drafts,
            draft_tokens,
            accepted,
            generation_tokens,
            tpot_sum,
            tpot_count,
            last_ts,
            *per_position,
        ) = found
        while per_position and per_position[-1] is None:  # positions this pair never reported
            per_position.pop()
        rows.append(
            HourlyRow(
                deployment,
                hour,
                target_name,
                target_version,
                drafter_version,
                gamma,
                intervals,
                int(resets),
                int(drafts),
                int(draft_tokens),
                int(accepted),
                [int(count or 0) for count in per_position],
                generation_tokens,
                tpot_sum,
                tpot_count,
                last_ts,
            )
        )
    return rows
