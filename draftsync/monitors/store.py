"""The monitor's SQL store: acceptance samples, hourly rollups, scrape baselines, watermarks, serving pairs,
alerts, outbox.

SQLite by default, Postgres in production (`postgresql+psycopg://...`). The schema is migrated with
Alembic when the store is opened (`draftsync.monitors.migrations`). Every time is passed in by the
caller (the demo runs a fake clock) and kept in UTC; a naive datetime is taken to be UTC. Windows are
(since, until]: a sample belongs to the window its interval ends in.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    case,
    create_engine,
    delete,
    event,
    func,
    make_url,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from draftsync.errors import DraftsyncError
from draftsync.monitors.metrics import SpecDecodeCounters, delta
from draftsync.monitors.migrations import upgrade_to_head

PairState = Literal["serving", "fallback", "stale"]
OutboxStatus = Literal["pending", "sent", "failed"]
Severity = Literal["info", "warning", "critical"]
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
ALERT_REPEAT_AFTER = timedelta(days=7)
HOUR = timedelta(hours=1)
NO_DRAFTER = 0  # hourly_rollups.drafter_version when speculation was off (MLflow versions start at 1)


def as_utc(moment: datetime) -> datetime:
    """An aware UTC datetime; naive input is taken to be UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def rollup_hour(ts: datetime) -> datetime:
    """The hour whose rollup row counts a sample stamped `ts`: rows cover (hour, hour + 1 h], like windows."""
    ts = as_utc(ts)
    floor = ts.replace(minute=0, second=0, microsecond=0)
    return floor - HOUR if floor == ts else floor


def _ceil_hour(moment: datetime) -> datetime:
    floor = moment.replace(minute=0, second=0, microsecond=0)
    return floor if floor == moment else floor + HOUR


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


class HourlyRollup(Base):
    """Sums of the samples of one deployment, hour and served pair, kept by `record_scrape` with each sample.

    The row keyed `hour` covers samples whose interval ends in (hour, hour + 1 h]; `drafter_version` is
    NO_DRAFTER (0) when speculation was off, since a key column cannot be NULL.
    """

    __tablename__ = "hourly_rollups"
    __table_args__ = (Index("ix_hourly_rollups_hour", "hour"),)

    deployment: Mapped[str] = mapped_column(String(200), primary_key=True)
    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    target_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    target_version: Mapped[int] = mapped_column(Integer, primary_key=True)
    drafter_version: Mapped[int] = mapped_column(Integer, primary_key=True)
    gamma: Mapped[int] = mapped_column(Integer, primary_key=True)
    intervals: Mapped[int] = mapped_column(Integer)
    resets: Mapped[int] = mapped_column(Integer)
    drafts: Mapped[int] = mapped_column(BigInteger)
    draft_tokens: Mapped[int] = mapped_column(BigInteger)
    accepted: Mapped[int] = mapped_column(BigInteger)
    accepted_per_position: Mapped[list[int]] = mapped_column(JSON)
    generation_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    tpot_sum: Mapped[float | None] = mapped_column(Float, nullable=True)
    tpot_count: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_ts: Mapped[datetime] = mapped_column(UTCDateTime())


ROLLUP_KEY = ("deployment", "hour", "target_name", "target_version", "drafter_version", "gamma")


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
        key = (sample.deployment, rollup_hour(sample.ts), sample.target_name, int(sample.target_version),
               None if sample.drafter_version in (None, NO_DRAFTER) else int(sample.drafter_version), int(sample.gamma))
        row = rows.get(key)
        if row is None:
            row = rows[key] = HourlyRow(*key)
        add_sample(row, sample)
    return sorted(rows.values(), key=lambda r: (r.deployment, r.hour, r.last_ts))


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


def _split_window(since: datetime, until: datetime) -> tuple[tuple[datetime, datetime] | None, list]:
    """(first, end) of the whole rollup hours inside (since, until], and the partial edges to read from samples."""
    first, end = _ceil_hour(since), until.replace(minute=0, second=0, microsecond=0)
    if first > end:  # both ends inside one hour
        return None, [(since, until)]
    edges = [(low, high) for low, high in ((since, first), (end, until)) if low < high]  # each inside one hour
    return ((first, end) if first < end else None), edges


def _rolled_up_between(low: datetime, high: datetime):
    """Deployments with a rollup row for an hour touching (low, high]: the only ones with samples there."""
    return (
        select(HourlyRollup.deployment)
        .where(HourlyRollup.hour >= rollup_hour(low + timedelta(microseconds=1)),
               HourlyRollup.hour <= rollup_hour(high))
        .distinct()
    )


def _summed_samples(session: Session, low: datetime, high: datetime, deployments) -> list[HourlyRow]:
    """The samples in (low, high], a part of one rollup hour, summed in SQL per deployment and served pair."""
    window = (Sample.deployment.in_(deployments), Sample.ts > low, Sample.ts <= high)
    width = session.scalar(select(func.max(func.json_array_length(Sample.accepted_per_position))).where(*window)) or 0
    pair = (Sample.deployment, Sample.target_name, Sample.target_version, Sample.drafter_version, Sample.gamma)
    query = select(
        *pair,
        func.count(),
        func.sum(case((Sample.reset, 1), else_=0)),
        *(func.sum(getattr(Sample, name)) for name in ("drafts", "draft_tokens", "accepted", "generation_tokens",
                                                       "tpot_sum", "tpot_count")),
        func.max(Sample.ts),
        *(func.sum(Sample.accepted_per_position[i].as_integer()) for i in range(width)),
    ).where(*window).group_by(*pair)
    hour = rollup_hour(high)
    rows = []
    for found in session.execute(query):
        (deployment, target_name, target_version, drafter_version, gamma, intervals, resets, drafts, draft_tokens,
         accepted, generation_tokens, tpot_sum, tpot_count, last_ts, *per_position) = found
        while per_position and per_position[-1] is None:  # positions this pair never reported
            per_position.pop()
        rows.append(HourlyRow(deployment, hour, target_name, target_version, drafter_version, gamma, intervals,
                              int(resets), int(drafts), int(draft_tokens), int(accepted),
                              [int(count or 0) for count in per_position], generation_tokens, tpot_sum, tpot_count,
                              last_ts))
    return rows


def _utc_session(dbapi_connection, _record) -> None:
    """Postgres returns times in the session's zone: in UTC the driver hands back datetime.UTC, cheapest to read."""
    cursor = dbapi_connection.cursor()
    cursor.execute("SET TIME ZONE 'UTC'")
    cursor.close()
    dbapi_connection.commit()


def dialect_insert(dialect: str):
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert


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


@dataclass(frozen=True)
class StoreFailure:
    """One way the store's database fails while in use: how it shows (Postgres SQLSTATEs, lower-case pieces of the
    driver's message) and what the user is told."""

    problem: str
    fix: str
    states: frozenset[str] = frozenset()
    phrases: tuple[str, ...] = ()


STORE_FAILURES = (
    StoreFailure(
        "lacks a table or column of its schema (were the migrations run?)",
        "run the migrations: restart the worker or run any draftsync command (opening the store migrates it to the "
        "newest schema); if the schema is already marked current, a table was dropped by hand: restore it from a "
        "backup or point DRAFTSYNC_MONITOR_DB_URL at a new database",
        frozenset({"42P01", "42703"}), ("no such table", "no such column"),
    ),
    StoreFailure(
        "is read-only",
        "make the database file and its folder writable by this user (SQLite writes a journal beside the file), or "
        "point DRAFTSYNC_MONITOR_DB_URL at a writable primary; after a refused write the store opens the file anew",
        frozenset({"25006"}), ("readonly database",),
    ),
    StoreFailure(
        "cannot read or write its storage",
        "check the disk and file system holding the database (full, remounted read-only, failing) and that this user "
        "may write the database file and its folder; the store opens the file anew on its next call",
        frozenset({"58030"}), ("disk i/o error",),
    ),
    StoreFailure(
        "is out of disk space",
        "free disk space where the database is stored (or grow its volume); the refused write changed nothing",
        frozenset({"53100"}), ("database or disk is full", "no space left on device"),
    ),
    StoreFailure(
        "refused access",
        "check the user and password in DRAFTSYNC_MONITOR_DB_URL, and that this user may log in and use the "
        "database and its tables (pg_hba.conf, LOGIN, GRANT)",
        frozenset({"28000", "28P01", "42501"}),
        ("password authentication failed", "no pg_hba.conf entry", "not permitted to log in", "permission denied"),
    ),
    StoreFailure(
        "is busy: a concurrent transaction held a lock too long or conflicted with this one",
        "retry; the refused transaction changed nothing (with many concurrent writers, use Postgres)",
        frozenset({"40001", "40P01", "55P03"}), ("database is locked",),
    ),
)
STORE_UNAVAILABLE = StoreFailure(
    "is unavailable",
    "start the database (or wait for its restart) and check that DRAFTSYNC_MONITOR_DB_URL points at it; the store "
    "reconnects on its next call, and what was written before is kept",
)


def store_failure(error: DBAPIError, url: str) -> DraftsyncError | None:
    """The DraftsyncError for a database failing under the store (down, refusing, read-only, full, a table missing).

    None for errors that are the statement's own, IntegrityError above all: callers rely on them as they are
    (the sync ledger's concurrency control)."""
    if isinstance(error, IntegrityError):
        return None
    state = getattr(error.orig, "sqlstate", None)
    message = str(error.orig).lower()
    failure = next((f for f in STORE_FAILURES if state in f.states or any(p in message for p in f.phrases)), None)
    if failure is None and (isinstance(error, (OperationalError, InterfaceError)) or error.connection_invalidated):
        failure = STORE_UNAVAILABLE
    if failure is None:
        return None
    return DraftsyncError(f"monitor store {_shown(url)} {failure.problem}: {_first_line(error, url)}", failure.fix)


def _reopen_after_refused_write(context) -> None:
    """SQLite opens a file it may not write read-only and stays so: a write refused that way (or by an I/O error)
    drops the connection, so the next call opens the file anew and writes once it is writable again. The pre-ping
    is left alone."""
    message = str(context.original_exception).lower()
    if not context.is_pre_ping and ("readonly database" in message or "disk i/o error" in message):
        context.is_disconnect = True


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
                event.listen(self.engine, "handle_error", _reopen_after_refused_write)
            upgrade_to_head(self.engine)
        except (SQLAlchemyError, ImportError) as exc:
            raise DraftsyncError(
                f"monitor store {_shown(url)} cannot be opened: {_first_line(exc, url)}",
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
            empty = {**key, "intervals": 0, "resets": 0, "drafts": 0, "draft_tokens": 0, "accepted": 0,
                     "accepted_per_position": [], "last_ts": sample.ts}
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

    def deployments_with_samples(self, since: datetime, until: datetime) -> list[str]:
        """Deployments with a sample in (since, until]: whole hours from the rollups, the edges from samples."""
        since, until = as_utc(since), as_utc(until)
        if until <= since:
            return []
        inner, edges = _split_window(since, until)
        names: set[str] = set()
        with self.transaction() as session:
            if inner is not None:
                names.update(session.scalars(
                    select(HourlyRollup.deployment).where(HourlyRollup.hour >= inner[0], HourlyRollup.hour < inner[1])
                    .distinct()
                ))
            for low, high in edges:
                names.update(session.scalars(
                    select(Sample.deployment)
                    .where(Sample.deployment.in_(_rolled_up_between(low, high)), Sample.ts > low, Sample.ts <= high)
                    .distinct()
                ))
        return sorted(names)

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
        inner, edges = _split_window(since, until)
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
                rows.extend(_summed_samples(session, low, high, _rolled_up_between(low, high) if names is None else names))
        if edges:
            rows.sort(key=lambda r: (r.deployment, r.hour, r.last_ts))
        by_deployment: dict[str, list[HourlyRow]] = {}
        for row in rows:
            by_deployment.setdefault(row.deployment, []).append(row)
        return by_deployment

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

    def alerts(self, deployment: str | None = None) -> list[Alert]:
        with self.transaction() as session:
            query = select(Alert).order_by(Alert.sent_at, Alert.id)
            if deployment is not None:
                query = query.where(Alert.deployment == deployment)
            return list(session.scalars(query).all())

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
            return result.rowcount == 1

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
