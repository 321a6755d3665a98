"""The monitor store's tables: the SQLAlchemy ORM models, their `Base`, and the served pair.

Kept apart from the repositories of each kind of record (`draftsync.monitors.store`) so that the Alembic
environment, the sync ledger's tables and the rollup arithmetic can use the schema without the store's sessions
and engine.
Every time is kept in UTC: `UTCDateTime` stores it so and gives back aware datetimes; a naive datetime
is taken to be UTC (`as_utc`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    CursorResult,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# "stopped": the servers draftsync started for it were stopped (the end of the demo); the row keeps what it served.
PairState = Literal["serving", "fallback", "stale", "stopped"]
OutboxStatus = Literal["pending", "sent", "failed"]
NO_DRAFTER = 0  # hourly_rollups.drafter_version when speculation was off (MLflow versions start at 1)


def as_utc(moment: datetime) -> datetime:
    """An aware UTC datetime; naive input is taken to be UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def updated_rows(result: Any) -> int:
    """The rows an UPDATE matched: its result is a cursor result, though Session.execute is typed for any statement."""
    return cast(CursorResult[Any], result).rowcount


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


class RequestAcceptance(Base):
    """One captured request's drafted and accepted tokens, booked at the scrape that read it (its `ts`) to the pair
    serving then: what per-domain and per-pair percentiles are taken from, where the counters only pool."""

    __tablename__ = "request_acceptance"
    __table_args__ = (Index("ix_request_acceptance_deployment_ts", "deployment", "ts"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    deployment: Mapped[str] = mapped_column(String(200))
    ts: Mapped[datetime] = mapped_column(UTCDateTime())
    target_version: Mapped[int] = mapped_column(Integer)
    drafter_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    domain: Mapped[str | None] = mapped_column(String(64), nullable=True)
    draft_tokens: Mapped[int] = mapped_column(Integer)
    accepted: Mapped[int] = mapped_column(Integer)


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


class PairInfo(Protocol):
    """What a sample is attributed to; a `ServingPair` row or a `ServedPair` both fit."""

    target_name: str
    target_version: int
    drafter_version: int | None
    gamma: int


@dataclass(frozen=True)
class ServedPair:
    """The pair a deployment serves, as plain data: a target version and the drafter trained for it (None:
    speculation off), launched with `gamma`, `method` and the per-batch-size `schedule` (None: one gamma).

    A rollout chooses one (flows/rollout.py `choose_pair`) and records it as the deployment's `ServingPair`
    row; it is also the PairInfo a sample is attributed to where no row is at hand."""

    target_name: str
    target_version: int
    drafter_version: int | None
    gamma: int
    drafter_name: str | None = None
    method: str | None = None
    schedule: list | None = None
    # vLLM's draft_sample_method it is launched with: the deployment's own, else what validation measured better
    # (None: vLLM's default)
    draft_sampling: str | None = None


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
    """One e-mail: the message, its `.eml` file in the outbox folder and its SMTP delivery state."""

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    subject: Mapped[str] = mapped_column(Text)
    recipients: Mapped[str] = mapped_column(Text)  # comma-separated
    eml_path: Mapped[str] = mapped_column(Text)
    # The message itself: a retry on another worker (another container) has no `.eml` file. None: written before 0005.
    message: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    status: Mapped[str] = mapped_column(String(20), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
