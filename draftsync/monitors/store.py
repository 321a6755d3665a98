"""The monitor's SQL store: the repository that records and reads acceptance samples, hourly rollups, scrape
baselines, watermarks, serving pairs, alerts and the outbox.

SQLite by default, Postgres in production (`postgresql+psycopg://...`). The schema is migrated with
Alembic when the store is opened (`draftsync.monitors.migrations`). Every time is passed in by the
caller (the demo runs a fake clock) and kept in UTC; a naive datetime is taken to be UTC. Windows are
(since, until]: a sample belongs to the window its interval ends in. The tables are in
`draftsync.monitors.tables`, the rollup arithmetic in `draftsync.monitors.rollups`, and what a failing
database raises in `draftsync.monitors.store_failures`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import get_args

from sqlalchemy import create_engine, delete, event, select, update
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from draftsync.errors import DraftsyncError
from draftsync.monitors.metrics import SpecDecodeCounters, delta
from draftsync.monitors.migrations import upgrade_to_head
from draftsync.monitors.rollups import (
    HourlyRow,
    add_sample,
    rolled_up_between,
    rollup_hour,
    split_window,
    summed_samples,
)
from draftsync.monitors.staleness import Severity
from draftsync.monitors.store_failures import masked_first_line, reopen_after_refused_write, store_failure
from draftsync.monitors.tables import (
    NO_DRAFTER,
    ROLLUP_KEY,
    Alert,
    HourlyRollup,
    OutboxEntry,
    OutboxStatus,
    PairInfo,
    PairState,
    RequestAcceptance,
    Sample,
    ScrapeState,
    ServingPair,
    Watermark,
    as_utc,
    updated_rows,
)
from draftsync.redaction import masked_url

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
ALERT_REPEAT_AFTER = timedelta(days=7)
CAPTURE_WATERMARK = "capture/"  # + deployment: the watermark of its capture file's rows already booked
# Booked requests are kept this long: the weekly review and a look back at the weeks before it read them.
REQUEST_RETENTION = timedelta(days=35)


def _utc_session(dbapi_connection, _record) -> None:
    """Postgres returns times in the session's zone: in UTC the driver hands back datetime.UTC, cheapest to read."""
    cursor = dbapi_connection.cursor()
    cursor.execute("SET TIME ZONE 'UTC'")
    cursor.close()
    dbapi_connection.commit()


def dialect_insert(dialect: str):
    from sqlalchemy.dialects import postgresql, sqlite

    return postgresql.insert if dialect == "postgresql" else sqlite.insert


class Store:
    """The monitor database. Opening it migrates the schema to the newest revision (Alembic).

    Every call runs in `transaction()`: the database failing while in use raises a DraftsyncError that names the
    store (password masked) and says what to do, the SQLAlchemy error chained."""

    def __init__(self, url: str, *, echo: bool = False):
        self.url = url
        try:
            # pre-ping: a database restarted between two scrapes costs a reconnect, not a failed scrape
            self.engine = create_engine(url, echo=echo, pool_pre_ping=True)
            if self.engine.dialect.name == "postgresql":
                event.listen(self.engine, "connect", _utc_session)
            if self.engine.dialect.name == "sqlite":
                event.listen(self.engine, "handle_error", reopen_after_refused_write)
            upgrade_to_head(self.engine)
        except (SQLAlchemyError, ImportError) as exc:
            raise DraftsyncError(
                f"monitor store {masked_url(url)} cannot be opened: {masked_first_line(exc, url)}",
                "check DRAFTSYNC_MONITOR_DB_URL: sqlite:///path/monitor.db or "
                "postgresql+psycopg://user:password@host:port/db, and that the database is reachable",
            ) from exc
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # SQLite has one writer at a time, and a transaction that reads before it writes can be refused at once
        # ("database is locked") rather than wait its busy timeout: 200 concurrent scrapes on busy CPUs failed so.
        # Within a process, transactions on a SQLite store therefore take turns; Postgres needs no such thing.
        self._one_at_a_time = threading.RLock() if self.engine.dialect.name == "sqlite" else contextlib.nullcontext()

    def close(self) -> None:
        self.engine.dispose()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        """One session in one transaction, committed at the end; see `store_failure` for what a failure raises."""
        try:
            with self._one_at_a_time, self._sessions.begin() as session:
                yield session
        except DBAPIError as error:
            failure = store_failure(error, self.url)
            if failure is None:
                raise
            raise failure from error

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
        with self.transaction() as session:
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

    def samples(self, deployment: str, since: datetime, until: datetime) -> list[Sample]:
        """Samples whose interval ends in (since, until], oldest first."""
        with self.transaction() as session:
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
        with self.transaction() as session:
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
        return self.get_watermark(CAPTURE_WATERMARK + deployment) or 0

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
        key = CAPTURE_WATERMARK + deployment
        with self.transaction() as session:
            session.execute(
                delete(RequestAcceptance).where(
                    RequestAcceptance.deployment == deployment, RequestAcceptance.ts < ts - REQUEST_RETENTION
                )
            )
            session.add_all(booked)
            mark = session.get(Watermark, key, with_for_update=True)
            if mark is None:
                session.add(Watermark(key=key, version=int(last_row), updated_at=ts))
            else:
                mark.version, mark.updated_at = int(last_row), ts
        return len(booked)

    def request_acceptance(self, deployment: str, since: datetime, until: datetime) -> list[RequestAcceptance]:
        """The booked requests of (since, until], oldest first."""
        with self.transaction() as session:
            query = (
                select(RequestAcceptance)
                .where(RequestAcceptance.deployment == deployment)
                .where(RequestAcceptance.ts > as_utc(since), RequestAcceptance.ts <= as_utc(until))
                .order_by(RequestAcceptance.ts, RequestAcceptance.id)
            )
            return list(session.scalars(query).all())

    # --- watermarks ---------------------------------------------------------------------------
    def get_watermark(self, key: str) -> int | None:
        """The last processed version for `key`, or None if nothing was processed yet."""
        with self.transaction() as session:
            row = session.get(Watermark, key)
            return None if row is None else row.version

    def set_watermark(self, key: str, version: int, now: datetime | None = None) -> None:
        now = as_utc(now or datetime.now(UTC))
        with self.transaction() as session:
            row = session.get(Watermark, key, with_for_update=True)
            if row is None:
                session.add(Watermark(key=key, version=int(version), updated_at=now))
            else:
                row.version = int(version)
                row.updated_at = now

    # --- serving pairs ------------------------------------------------------------------------
    def set_serving_pair(
        self,
        deployment: str,
        *,
        target_name: str,
        target_version: int,
        drafter_name: str | None,
        drafter_version: int | None,
        gamma: int,
        endpoint: str,
        state: PairState,
        now: datetime | None = None,
    ) -> ServingPair:
        """Record what `deployment` serves now (insert or replace)."""
        _check_pair_state(deployment, state)
        now = as_utc(now or datetime.now(UTC))
        values = dict(
            target_name=target_name,
            target_version=int(target_version),
            drafter_name=drafter_name,
            drafter_version=None if drafter_version is None else int(drafter_version),
            gamma=int(gamma),
            endpoint=endpoint,
            state=state,
            updated_at=now,
        )
        with self.transaction() as session:
            row = session.scalars(
                select(ServingPair).where(ServingPair.deployment == deployment).with_for_update()
            ).one_or_none()
            if row is None:
                row = ServingPair(deployment=deployment, **values)
                session.add(row)
            else:
                for name, value in values.items():
                    setattr(row, name, value)
            return row

    def set_pair_state(self, deployment: str, state: PairState) -> ServingPair | None:
        """Change only the state of what `deployment` serves (None if it has no pair).

        The pair's `updated_at` stays: it dates the pair's start, from which the weekly review counts its weeks."""
        _check_pair_state(deployment, state)
        with self.transaction() as session:
            row = session.scalars(
                select(ServingPair).where(ServingPair.deployment == deployment).with_for_update()
            ).one_or_none()
            if row is not None:
                row.state = state
            return row

    def forget_scrape_baseline(self, deployment: str) -> None:
        """A new server instance counts from zero: its first scrape must not be diffed against the old one's."""
        with self.transaction() as session:
            session.execute(delete(ScrapeState).where(ScrapeState.deployment == deployment))

    def serving_pair(self, deployment: str) -> ServingPair | None:
        with self.transaction() as session:
            return session.scalars(select(ServingPair).where(ServingPair.deployment == deployment)).one_or_none()

    def serving_pairs(self) -> list[ServingPair]:
        with self.transaction() as session:
            return list(session.scalars(select(ServingPair).order_by(ServingPair.deployment)).all())

    # --- alerts -------------------------------------------------------------------------------
    def should_alert(
        self,
        key: str,
        now: datetime,
        value: float,
        *,
        severity: Severity = "warning",
        higher_is_worse: bool = False,
        margin: float = 0.05,
        repeat_after: timedelta = ALERT_REPEAT_AFTER,
    ) -> bool:
        """Whether a finding deserves an e-mail: not sent within `repeat_after`, unless it got worse.

        Worse means a higher severity, or the value moved past the last alert's by more than
        `margin` in the bad direction (down for acceptance; up when `higher_is_worse`).
        """
        now = as_utc(now)
        with self.transaction() as session:
            last = session.scalars(
                select(Alert).where(Alert.key == key).order_by(Alert.sent_at.desc(), Alert.id.desc()).limit(1)
            ).one_or_none()
        if last is None or now - last.sent_at >= repeat_after:
            return True
        if SEVERITY_RANK.get(severity, 0) > SEVERITY_RANK.get(last.severity, 0):
            return True
        change = value - last.value
        return change > margin if higher_is_worse else change < -margin

    def record_alert(
        self,
        key: str,
        *,
        deployment: str,
        rule: str,
        severity: Severity,
        value: float,
        sent_at: datetime,
        outbox_id: int | None = None,
    ) -> Alert:
        with self.transaction() as session:
            row = Alert(
                key=key,
                deployment=deployment,
                rule=rule,
                severity=severity,
                value=float(value),
                sent_at=as_utc(sent_at),
                outbox_id=outbox_id,
            )
            session.add(row)
            return row

    # --- outbox -------------------------------------------------------------------------------
    def add_outbox(self, *, subject: str, recipients: list[str], eml_path: str, created_at: datetime) -> OutboxEntry:
        with self.transaction() as session:
            row = OutboxEntry(
                created_at=as_utc(created_at),
                subject=subject,
                recipients=",".join(recipients),
                eml_path=eml_path,
                status="pending",
                attempts=0,
            )
            session.add(row)
            return row

    def outbox(self, status: OutboxStatus | None = None) -> list[OutboxEntry]:
        with self.transaction() as session:
            query = select(OutboxEntry).order_by(OutboxEntry.id)
            if status is not None:
                query = query.where(OutboxEntry.status == status)
            return list(session.scalars(query).all())

    def claim_outbox(self, entry_id: int, seen_attempts: int) -> bool:
        """Count a delivery attempt, only if nobody else has started one since we read the entry.

        Two retry loops racing over the same pending e-mail: exactly one wins the claim.
        """
        with self.transaction() as session:
            result = session.execute(
                update(OutboxEntry)
                .where(
                    OutboxEntry.id == entry_id,
                    OutboxEntry.status == "pending",
                    OutboxEntry.attempts == seen_attempts,
                )
                .values(attempts=seen_attempts + 1)
            )
            return updated_rows(result) == 1

    def mark_outbox(
        self, entry_id: int, status: OutboxStatus, *, error: str | None = None, sent_at: datetime | None = None
    ) -> OutboxEntry:
        with self.transaction() as session:
            row = session.get(OutboxEntry, entry_id, with_for_update=True)
            if row is None:
                raise DraftsyncError(f"outbox entry {entry_id}", "it is not in the monitor store; was the store reset?")
            row.status = status
            row.last_error = error
            if sent_at is not None:
                row.sent_at = as_utc(sent_at)
            return row

    def outbox_entry(self, entry_id: int) -> OutboxEntry | None:
        with self.transaction() as session:
            return session.get(OutboxEntry, entry_id)


def _check_pair_state(deployment: str, state: str) -> None:
    states = get_args(PairState)
    if state not in states:
        raise DraftsyncError(
            f"serving pair state {state!r} for {deployment}", "use one of " + ", ".join(repr(s) for s in states)
        )
