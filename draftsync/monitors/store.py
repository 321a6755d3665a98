"""The monitor's SQL store: acceptance samples, scrape baselines, watermarks, serving pairs, alerts, outbox.

SQLite by default, Postgres in production (`postgresql+psycopg://...`). Every time is passed in by
the caller (the demo runs a fake clock) and kept in UTC; a naive datetime is taken to be UTC.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    create_engine,
    delete,
    make_url,
    select,
    update,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from draftsync.errors import DraftsyncError
from draftsync.monitors.metrics import SpecDecodeCounters, delta

PairState = Literal["serving", "fallback", "stale"]
OutboxStatus = Literal["pending", "sent", "failed"]
Severity = Literal["info", "warning", "critical"]
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
ALERT_REPEAT_AFTER = timedelta(days=7)


def as_utc(moment: datetime) -> datetime:
    """An aware UTC datetime; naive input is taken to be UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


class UTCDateTime(TypeDecorator):
    """Stores UTC and always gives back aware UTC datetimes (SQLite would drop the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        value = as_utc(value)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        return None if value is None else as_utc(value)


class Base(DeclarativeBase):
    pass


class Sample(Base):
    """Counter deltas of one scrape interval (interval_start, ts], attributed to the pair being served."""

    __tablename__ = "samples"
    __table_args__ = (Index("ix_samples_deployment_ts", "deployment", "ts"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    deployment: Mapped[str] = mapped_column(String(200))
    ts: Mapped[datetime] = mapped_column(UTCDateTime())
    interval_start: Mapped[datetime] = mapped_column(UTCDateTime())
    target_name: Mapped[str] = mapped_column(String(200))
    target_version: Mapped[int] = mapped_column(Integer)
    drafter_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gamma: Mapped[int] = mapped_column(Integer)
    drafts: Mapped[int] = mapped_column(Integer)
    draft_tokens: Mapped[int] = mapped_column(Integer)
    accepted: Mapped[int] = mapped_column(Integer)
    accepted_per_position: Mapped[list[int]] = mapped_column(JSON)
    generation_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpot_sum: Mapped[float | None] = mapped_column(Float, nullable=True)
    tpot_count: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reset: Mapped[bool] = mapped_column(default=False)


class ScrapeState(Base):
    """The last raw counters seen per deployment: the baseline the next delta is taken against."""

    __tablename__ = "scrape_state"

    deployment: Mapped[str] = mapped_column(String(200), primary_key=True)
    ts: Mapped[datetime] = mapped_column(UTCDateTime())
    counters: Mapped[dict[str, Any]] = mapped_column(JSON)


class Watermark(Base):
    """The last processed version per key (e.g. a target registered-model name)."""

    __tablename__ = "watermarks"

    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ServingPair(Base):
    """What a deployment serves now: target version, its drafter (None when speculation is off), state."""

    __tablename__ = "serving_pairs"

    id: Mapped[int] = mapped_column(primary_key=True)
    deployment: Mapped[str] = mapped_column(String(200), unique=True)
    target_name: Mapped[str] = mapped_column(String(200))
    target_version: Mapped[int] = mapped_column(Integer)
    drafter_name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    drafter_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gamma: Mapped[int] = mapped_column(Integer)
    endpoint: Mapped[str] = mapped_column(String(500))
    state: Mapped[str] = mapped_column(String(20))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Alert(Base):
    """An alert that went out; `key` (deployment:rule) is what repeats are deduplicated on."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_key_sent_at", "key", "sent_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(300))
    deployment: Mapped[str] = mapped_column(String(200))
    rule: Mapped[str] = mapped_column(String(100))
    severity: Mapped[str] = mapped_column(String(20))
    value: Mapped[float] = mapped_column(Float)
    sent_at: Mapped[datetime] = mapped_column(UTCDateTime())
    outbox_id: Mapped[int | None] = mapped_column(ForeignKey("outbox.id"), nullable=True)


class OutboxEntry(Base):
    """One e-mail: its `.eml` file in the outbox folder and its SMTP delivery state."""

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    subject: Mapped[str] = mapped_column(Text)
    recipients: Mapped[str] = mapped_column(Text)  # comma-separated
    eml_path: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(20), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class PairInfo(Protocol):
    """What a sample is attributed to; a `ServingPair` row or a `ServedPair` both fit."""

    target_name: str
    target_version: int
    drafter_version: int | None
    gamma: int


@dataclass(frozen=True)
class ServedPair:
    """A plain PairInfo for callers that have no serving_pairs row at hand."""

    target_name: str
    target_version: int
    drafter_version: int | None
    gamma: int


def _shown(url: str) -> str:
    """The URL with any password masked, for error messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except SQLAlchemyError:
        return "<unparsable URL>"


def _first_line(exc: Exception, url: str) -> str:
    """The exception's first line, with the URL's password (if any) masked."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    try:
        password = make_url(url).password
    except SQLAlchemyError:
        password = None
    return line.replace(str(password), "***") if password else line


class Store:
    """The monitor database. Creates its tables on first use (create_all; migrations come later)."""

    def __init__(self, url: str, *, echo: bool = False):
        self.url = url
        try:
            self.engine = create_engine(url, echo=echo)
            Base.metadata.create_all(self.engine)
        except (SQLAlchemyError, ImportError) as exc:
            raise DraftsyncError(
                f"monitor store {_shown(url)} cannot be opened: {_first_line(exc, url)}",
                "check DRAFTSYNC_MONITOR_DB_URL: sqlite:///path/monitor.db or "
                "postgresql+psycopg://user:password@host:port/db, and that the database is reachable",
            ) from exc
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()

    @contextlib.contextmanager
    def _session(self) -> Iterator[Session]:
        with self._sessions.begin() as session:
            yield session

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
        """
        ts = as_utc(ts)
        with self._session() as session:
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
                        f"scrape of {deployment} at {ts.isoformat()} is not after the last one ({state.ts.isoformat()})",
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
            return sample

    def samples(self, deployment: str, since: datetime, until: datetime) -> list[Sample]:
        """Samples whose interval ends in (since, until], oldest first."""
        with self._session() as session:
            rows = session.scalars(
                select(Sample)
                .where(Sample.deployment == deployment, Sample.ts > as_utc(since), Sample.ts <= as_utc(until))
                .order_by(Sample.ts, Sample.id)
            ).all()
            return list(rows)

    def deployments_with_samples(self, since: datetime, until: datetime) -> list[str]:
        with self._session() as session:
            rows = session.scalars(
                select(Sample.deployment)
                .where(Sample.ts > as_utc(since), Sample.ts <= as_utc(until))
                .distinct()
                .order_by(Sample.deployment)
            ).all()
            return list(rows)

    # --- watermarks ---------------------------------------------------------------------------
    def get_watermark(self, key: str) -> int | None:
        """The last processed version for `key`, or None if nothing was processed yet."""
        with self._session() as session:
            row = session.get(Watermark, key)
            return None if row is None else row.version

    def set_watermark(self, key: str, version: int, now: datetime | None = None) -> None:
        now = as_utc(now or datetime.now(UTC))
        with self._session() as session:
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
        if state not in ("serving", "fallback", "stale"):
            raise DraftsyncError(
                f"serving pair state {state!r} for {deployment}", "use one of 'serving', 'fallback', 'stale'"
            )
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
        with self._session() as session:
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

    def forget_scrape_baseline(self, deployment: str) -> None:
        """A new server instance counts from zero: its first scrape must not be diffed against the old one's."""
        with self._session() as session:
            session.execute(delete(ScrapeState).where(ScrapeState.deployment == deployment))

    def serving_pair(self, deployment: str) -> ServingPair | None:
        with self._session() as session:
            return session.scalars(select(ServingPair).where(ServingPair.deployment == deployment)).one_or_none()

    def serving_pairs(self) -> list[ServingPair]:
        with self._session() as session:
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
        with self._session() as session:
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
        with self._session() as session:
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

    def alerts(self, deployment: str | None = None) -> list[Alert]:
        with self._session() as session:
            query = select(Alert).order_by(Alert.sent_at, Alert.id)
            if deployment is not None:
                query = query.where(Alert.deployment == deployment)
            return list(session.scalars(query).all())

    # --- outbox -------------------------------------------------------------------------------
    def add_outbox(self, *, subject: str, recipients: list[str], eml_path: str, created_at: datetime) -> OutboxEntry:
        with self._session() as session:
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
        with self._session() as session:
            query = select(OutboxEntry).order_by(OutboxEntry.id)
            if status is not None:
                query = query.where(OutboxEntry.status == status)
            return list(session.scalars(query).all())

    def claim_outbox(self, entry_id: int, seen_attempts: int) -> bool:
        """Count a delivery attempt, only if nobody else has started one since we read the entry.

        Two retry loops racing over the same pending e-mail: exactly one wins the claim.
        """
        with self._session() as session:
            result = session.execute(
                update(OutboxEntry)
                .where(
                    OutboxEntry.id == entry_id,
                    OutboxEntry.status == "pending",
                    OutboxEntry.attempts == seen_attempts,
                )
                .values(attempts=seen_attempts + 1)
            )
            return result.rowcount == 1

    def mark_outbox(
        self, entry_id: int, status: OutboxStatus, *, error: str | None = None, sent_at: datetime | None = None
    ) -> OutboxEntry:
        with self._session() as session:
            row = session.get(OutboxEntry, entry_id, with_for_update=True)
            if row is None:
                raise DraftsyncError(f"outbox entry {entry_id}", "it is not in the monitor store; was the store reset?")
            row.status = status
            row.last_error = error
            if sent_at is not None:
                row.sent_at = as_utc(sent_at)
            return row

    def outbox_entry(self, entry_id: int) -> OutboxEntry | None:
        with self._session() as session:
            return session.get(OutboxEntry, entry_id)
