"""Acceptance records: the samples a scrape stores (with the scrape baseline they are taken against), their hourly
rollups, and the per-request acceptance booked from captured traffic.

Every time is passed in by the caller (the demo runs a fake clock) and kept in UTC; a naive datetime is taken to
be UTC. Windows are (since, until]: a sample belongs to the window its interval ends in. The rollup arithmetic is in
`draftsync.monitors.rollups`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from draftsync.errors import DraftsyncError
from draftsync.monitors.database import Database, Repository, dialect_insert
from draftsync.monitors.metrics import SpecDecodeCounters, delta
from draftsync.monitors.rollups import (
    HourlyRow,
    add_sample,
    rolled_up_between,
    rollup_hour,
    split_window,
    summed_samples,
)
from draftsync.monitors.tables import (
    NO_DRAFTER,
    ROLLUP_KEY,
    HourlyRollup,
    PairInfo,
    RequestAcceptance,
    Sample,
    ScrapeState,
    as_utc,
)
from draftsync.monitors.watermarks import Watermarks, move_watermark

CAPTURE_WATERMARK = "capture/"  # + deployment: the watermark of its capture file's rows already booked
# Booked requests are kept this long: the weekly review and a look back at the weeks before it read them.
REQUEST_RETENTION = timedelta(days=35)


class AcceptanceRecords(Repository):
    """The `samples`, `hourly_rollups`, `scrape_state` and `request_acceptance` tables of the monitor store; the
    capture watermarks are kept in `watermarks`."""

    def __init__(self, database: Database, watermarks: Watermarks):
        super().__init__(database)
        self._watermarks = watermarks

    # --- scrapes and samples -------------------------------------------------------------------
    def record_scrape(
        self,
        deployment: str,
        ts: datetime,
        counters: SpecDecodeCounters,
        pair: PairInfo,
        *,
        count_first: bool = False,
    ) -> Sample | None:
        """Keep `counters` as the deployment's baseline and store the delta since the last scrape.

        The first scrape of a deployment only sets the baseline and returns None: a scraper that
        joins a long-running server must not book its whole history into one interval. Pass
        `count_first=True` when the server is known to have started at zero (e.g. just launched);
        that first sample then covers (ts, ts].

        The sample's hourly rollup row is updated in the same transaction.
        """
        ts = as_utc(ts)
        with self._database.transaction() as session:
            state = session.scalars(
                select(ScrapeState).where(ScrapeState.deployment == deployment).with_for_update()
            ).one_or_none()
            if state is None:
                session.add(ScrapeState(deployment=deployment, ts=ts, counters=counters.to_dict()))
                if not count_first:
                    return None
                change, reset, interval_start = counters, False, ts
            else:
                if ts <= state.ts:
                    raise DraftsyncError(
                        f"scrape of {deployment} at {ts.isoformat()} is not after the last one "
                        f"({state.ts.isoformat()})",
                        "pass a clock that moves forward; each scrape needs a later timestamp",
                    )
                change, reset = delta(SpecDecodeCounters.from_dict(state.counters), counters)
                interval_start = state.ts
                state.ts = ts
                state.counters = counters.to_dict()
            sample = Sample(
                deployment=deployment,
                ts=ts,
                interval_start=interval_start,
                target_name=pair.target_name,
                target_version=int(pair.target_version),
                drafter_version=None if pair.drafter_version is None else int(pair.drafter_version),
                gamma=int(pair.gamma),
                drafts=change.drafts,
                draft_tokens=change.draft_tokens,
                accepted=change.accepted,
                accepted_per_position=list(change.accepted_per_position),
                generation_tokens=change.generation_tokens,
                tpot_sum=change.tpot_sum,
                tpot_count=change.tpot_count,
                reset=reset,
            )
            session.add(sample)
            self._add_to_rollup(session, sample)
            return sample

    @staticmethod
    def _add_to_rollup(session: Session, sample: Sample) -> None:
        """Upsert the sample's hourly row: insert it if absent (ON CONFLICT DO NOTHING), then lock and add.

        The per-position counts are a JSON list, so the sums are made here rather than in SQL; the row
        lock (Postgres) or the write lock (SQLite) keeps concurrent writers from losing an update.
        """
        key = {
            "deployment": sample.deployment,
            "hour": rollup_hour(sample.ts),
            "target_name": sample.target_name,
            "target_version": sample.target_version,
            "drafter_version": NO_DRAFTER if sample.drafter_version is None else sample.drafter_version,
            "gamma": sample.gamma,
        }
        identity = tuple(key[name] for name in ROLLUP_KEY)
        row = session.get(HourlyRollup, identity, with_for_update=True)
        if row is None:
            empty = {
                **key,
                "intervals": 0,
                "resets": 0,
                "drafts": 0,
                "draft_tokens": 0,
                "accepted": 0,
                "accepted_per_position": [],
                "last_ts": sample.ts,
            }
            dialect = session.get_bind().dialect.name
            if dialect in ("postgresql", "sqlite"):
                insert = dialect_insert(dialect)
                session.execute(insert(HourlyRollup).values(**empty).on_conflict_do_nothing(index_elements=ROLLUP_KEY))
                row = session.get(HourlyRollup, identity, with_for_update=True, populate_existing=True)
            else:
                row = HourlyRollup(**empty)
                session.add(row)
        add_sample(row, sample)

    def forget_baseline(self, deployment: str) -> None:
        """A new server instance counts from zero: its first scrape must not be diffed against the old one's."""
        with self._database.transaction() as session:
            session.execute(delete(ScrapeState).where(ScrapeState.deployment == deployment))

    def samples(self, deployment: str, since: datetime, until: datetime) -> list[Sample]:
        """Samples whose interval ends in (since, until], oldest first."""
        with self._database.transaction() as session:
            rows = session.scalars(
                select(Sample)
                .where(Sample.deployment == deployment, Sample.ts > as_utc(since), Sample.ts <= as_utc(until))
                .order_by(Sample.ts, Sample.id)
            ).all()
            return list(rows)

    def hourly(self, deployment: str, since: datetime, until: datetime) -> list[HourlyRow]:
        """The hourly rows of one deployment over (since, until], oldest first."""
        return self.rollup_window(since, until, [deployment]).get(deployment, [])

    def rollup_window(
        self, since: datetime, until: datetime, deployments: Sequence[str] | None = None
    ) -> dict[str, list[HourlyRow]]:
        """Hourly rows over (since, until] per deployment (all with samples, or those named), oldest first.

        The whole hours come from the rollup table in one query; where the window starts or ends inside
        an hour, that hour is summed from the samples in the window, so the sums are exact for any window.
        A week of 1,000 deployments is 168,000 rows, however often they were scraped.
        """
        since, until = as_utc(since), as_utc(until)
        if until <= since:
            return {}
        names = None if deployments is None else list(deployments)
        inner, edges = split_window(since, until)
        rows: list[HourlyRow] = []
        with self._database.transaction() as session:
            if inner is not None:
                table = HourlyRollup.__table__
                query = (
                    select(*(table.c[f.name] for f in fields(HourlyRow)))
                    .where(table.c.hour >= inner[0], table.c.hour < inner[1])
                    .order_by(table.c.deployment, table.c.hour, table.c.last_ts)
                )
                if names is not None:
                    query = query.where(table.c.deployment.in_(names))
                for stored in session.connection().execute(query).all():  # Core rows: ~168 per deployment and week
                    row = HourlyRow(*stored)
                    if row.drafter_version == NO_DRAFTER:
                        row.drafter_version = None
                    rows.append(row)
            for low, high in edges:
                rows.extend(
                    summed_samples(session, low, high, rolled_up_between(low, high) if names is None else names)
                )
        if edges:
            rows.sort(key=lambda r: (r.deployment, r.hour, r.last_ts))
        by_deployment: dict[str, list[HourlyRow]] = {}
        for row in rows:
            by_deployment.setdefault(row.deployment, []).append(row)
        return by_deployment

    # --- per-request acceptance (captured traffic) --------------------------------------------
    def captured_watermark(self, deployment: str) -> int:
        """The last capture-file row of `deployment` already booked (0: none)."""
        return self._watermarks.get(CAPTURE_WATERMARK + deployment) or 0

    def book_requests(self, deployment: str, ts: datetime, pair: PairInfo, rows: Sequence[dict], last_row: int) -> int:
        """Book captured requests (`domain`, `draft_tokens`, `accepted_tokens`) at the monitor's `ts` to the pair
        serving then, and move the deployment's capture watermark to `last_row` in the same transaction, so a row
        is booked once. Requests that drafted nothing are not booked: they have no rate. The deployment's rows older
        than REQUEST_RETENTION go. Returns how many were booked."""
        ts = as_utc(ts)
        booked = [
            RequestAcceptance(
                deployment=deployment,
                ts=ts,
                target_version=int(pair.target_version),
                drafter_version=None if pair.drafter_version is None else int(pair.drafter_version),
                domain=row.get("domain"),
                draft_tokens=int(row["draft_tokens"]),
                accepted=int(row["accepted_tokens"] or 0),
            )
            for row in rows
            if row.get("draft_tokens")
        ]
        with self._database.transaction() as session:
            session.execute(
                delete(RequestAcceptance).where(
                    RequestAcceptance.deployment == deployment, RequestAcceptance.ts < ts - REQUEST_RETENTION
                )
            )
            session.add_all(booked)
            move_watermark(session, CAPTURE_WATERMARK + deployment, last_row, ts)
        return len(booked)

    def booked_requests(self, deployment: str, since: datetime, until: datetime) -> list[RequestAcceptance]:
        """The booked requests of (since, until], oldest first."""
        with self._database.transaction() as session:
            query = (
                select(RequestAcceptance)
                .where(RequestAcceptance.deployment == deployment)
                .where(RequestAcceptance.ts > as_utc(since), RequestAcceptance.ts <= as_utc(until))
                .order_by(RequestAcceptance.ts, RequestAcceptance.id)
            )
            return list(session.scalars(query).all())
