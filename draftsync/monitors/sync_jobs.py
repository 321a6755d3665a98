"""The sync ledger: one row per (target, version, method), so duplicate triggers make exactly one sync.

Every path that wants a drafter (an MLflow webhook, the registry poll, an alias move, a stale finding,
a rollout that found no drafter) asks the ledger first; only the caller whose row insert (or re-open)
wins emits the event that starts the sync, and the sync flow claims the row again before it trains,
so a duplicate event, a second watcher or a second receiver replica changes nothing. The same tables
hold the webhook receiver's delivery ids for its replay check. All changes are single conditional
statements, atomic on SQLite and Postgres alike.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from sqlalchemy import Index, Integer, String, Text, UniqueConstraint, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column

from draftsync.monitors.database import Database, Repository, dialect_insert
from draftsync.monitors.tables import Base, UTCDateTime, as_utc, updated_rows

JobStatus = Literal["requested", "running", "succeeded", "failed"]
ClaimOutcome = Literal["claimed", "running", "done", "exhausted"]
MAX_ATTEMPTS = 3  # a sync that crashed this often stays failed until a retrain or a hand-started sync
DELIVERY_MEMORY = timedelta(days=1)  # far longer than any accepted webhook timestamp age


class SyncJob(Base):
    """A sync of one target version with one method; `generation` counts retrains of the same key."""

    __tablename__ = "sync_jobs"
    __table_args__ = (UniqueConstraint("target_name", "target_version", "method", name="uq_sync_jobs_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    target_name: Mapped[str] = mapped_column(String(200))
    target_version: Mapped[int] = mapped_column(Integer)
    method: Mapped[str] = mapped_column(String(20))
    status: Mapped[str] = mapped_column(String(20))
    generation: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    source: Mapped[str] = mapped_column(String(50))
    reason: Mapped[str] = mapped_column(Text)
    requested_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    run_id: Mapped[str | None] = mapped_column(String(100), nullable=True)
    drafter_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)


class WebhookDelivery(Base):
    """A webhook delivery id already accepted: a second delivery with the same id is a replay."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_received_at", "received_at"),)

    delivery_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime())


@dataclass(frozen=True)
class Claim:
    """The sync flow's claim on a job: `claimed` (train now), `running` (another run has it), `done`
    (succeeded before; only a retrain re-opens it) or `exhausted` (failed MAX_ATTEMPTS times)."""

    outcome: ClaimOutcome
    job: SyncJob


def _now(now: datetime | None) -> datetime:
    return as_utc(now or datetime.now(UTC))


class SyncLedger(Repository):
    """Sync jobs and webhook deliveries in the monitor store's database (the store's `ledger`)."""

    def __init__(self, database: Database):
        super().__init__(database)
        self._insert = dialect_insert(database.engine.dialect.name)

    def _session(self) -> contextlib.AbstractContextManager[Session]:
        """The store's transaction: the database failing while in use is a DraftsyncError naming the store."""
        return self._database.transaction()

    @staticmethod
    def _key(target_name: str, target_version: int, method: str):
        return (
            SyncJob.target_name == target_name,
            SyncJob.target_version == int(target_version),
            SyncJob.method == method,
        )

    def get(self, target_name: str, target_version: int, method: str) -> SyncJob | None:
        with self._session() as session:
            return session.scalars(select(SyncJob).where(*self._key(target_name, target_version, method))).first()

    def jobs(self, target_name: str | None = None) -> list[SyncJob]:
        query = select(SyncJob).order_by(SyncJob.target_name, SyncJob.target_version, SyncJob.method)
        if target_name is not None:
            query = query.where(SyncJob.target_name == target_name)
        with self._session() as session:
            return list(session.scalars(query))

    def request(
        self,
        target_name: str,
        target_version: int,
        method: str,
        *,
        source: str,
        reason: str,
        retrain: bool = False,
        now: datetime | None = None,
    ) -> bool:
        """Ask for a sync; True only for the one caller that should start it.

        A new key is inserted; a job that failed fewer than MAX_ATTEMPTS times is re-opened; a finished
        job is re-opened (as the next generation) only for a retrain. Everything else is a duplicate.
        """
        now = _now(now)
        row = dict(
            target_name=target_name,
            target_version=int(target_version),
            method=method,
            status="requested",
            generation=0,
            attempts=0,
            source=source,
            reason=reason,
            requested_at=now,
        )
        with self._session() as session:
            inserted = session.execute(
                self._insert(SyncJob.__table__)
                .values(**row)
                .on_conflict_do_nothing(index_elements=["target_name", "target_version", "method"])
                .returning(SyncJob.id)
            ).first()
        if inserted is not None:
            return True
        reopen = SyncJob.status == "failed"
        if retrain:
            reopen = SyncJob.status.in_(("succeeded", "failed"))
        else:
            reopen = reopen & (SyncJob.attempts < MAX_ATTEMPTS)
        changes = dict(status="requested", source=source, reason=reason, requested_at=now)
        if retrain:
            changes.update(generation=SyncJob.generation + 1, attempts=0)
        with self._session() as session:
            result = session.execute(
                update(SyncJob).where(*self._key(target_name, target_version, method), reopen).values(**changes)
            )
            return updated_rows(result) == 1

    def overdue(self, older_than: timedelta, now: datetime | None = None) -> list[SyncJob]:
        """Jobs requested longer ago than `older_than` that no sync claimed: their event may have been lost."""
        cutoff = _now(now) - older_than
        with self._session() as session:
            return list(
                session.scalars(select(SyncJob).where(SyncJob.status == "requested", SyncJob.requested_at < cutoff))
            )

    def running(self) -> list[SyncJob]:
        """Jobs a run holds now (or held when it died: the reconciler checks which)."""
        with self._session() as session:
            return list(session.scalars(select(SyncJob).where(SyncJob.status == "running")))

    def release(self, job_id: int, run_id: str, now: datetime | None = None) -> JobStatus | None:
        """Give back the job of a run known to be dead: `requested` again, or `failed` once it had MAX_ATTEMPTS.

        Only while that run still holds it (a run that took it over meanwhile keeps it); returns the new status,
        None when nothing changed. A worker killed mid-sync leaves its job `running`; this is how it resumes
        without anyone starting it by hand, and how a sync that kills its worker every time stops."""
        now = _now(now)
        held = (SyncJob.id == job_id, SyncJob.status == "running", SyncJob.run_id == run_id)
        died = f"run {run_id} died"
        with self._session() as session:
            if (
                updated_rows(
                    session.execute(
                        update(SyncJob)
                        .where(*held, SyncJob.attempts < MAX_ATTEMPTS)
                        .values(status="requested", requested_at=now, detail=f"{died}; requested again")
                    )
                )
                == 1
            ):
                return "requested"
            if (
                updated_rows(
                    session.execute(
                        update(SyncJob)
                        .where(*held)
                        .values(
                            status="failed", finished_at=now, detail=f"{died}; gave up after {MAX_ATTEMPTS} attempts"
                        )
                    )
                )
                == 1
            ):
                return "failed"
        return None

    def touch_request(self, job_id: int, now: datetime | None = None) -> None:
        """Restart an overdue request's clock after its event was sent again."""
        with self._session() as session:
            session.execute(
                update(SyncJob)
                .where(SyncJob.id == job_id, SyncJob.status == "requested")
                .values(requested_at=_now(now))
            )

    def claim(
        self,
        target_name: str,
        target_version: int,
        method: str,
        *,
        run_id: str | None,
        source: str = "direct",
        reason: str = "sync started directly",
        retrain: bool = False,
        takeover_from: str | None = None,
        now: datetime | None = None,
    ) -> Claim:
        """Take the job for this run: the sync trains only with outcome `claimed`.

        A sync started without a request (by hand, or by an event for a version nobody asked about)
        requests first. `takeover_from` names a run known to be dead (crashed or cancelled) whose
        `running` job this run may take over.
        """
        now = _now(now)
        self.request(target_name, target_version, method, source=source, reason=reason, retrain=retrain, now=now)
        claimable = SyncJob.status == "requested"
        if takeover_from is not None:
            claimable = claimable | ((SyncJob.status == "running") & (SyncJob.run_id == takeover_from))
        with self._session() as session:
            claimed = (
                updated_rows(
                    session.execute(
                        update(SyncJob)
                        .where(*self._key(target_name, target_version, method), claimable)
                        .values(
                            status="running",
                            started_at=now,
                            finished_at=None,
                            run_id=run_id,
                            attempts=SyncJob.attempts + 1,
                            detail=None,
                        )
                    )
                )
                == 1
            )
        job = self.get(target_name, target_version, method)
        assert job is not None, "request() above made the row"
        if claimed:
            return Claim("claimed", job)
        outcomes: dict[str, ClaimOutcome] = {"succeeded": "done", "failed": "exhausted"}
        return Claim(outcomes.get(job.status, "running"), job)

    def finish(
        self,
        job_id: int,
        status: Literal["succeeded", "failed"],
        *,
        drafter_version: int | None = None,
        detail: str | None = None,
        now: datetime | None = None,
    ) -> None:
        with self._session() as session:
            session.execute(
                update(SyncJob)
                .where(SyncJob.id == job_id)
                .values(status=status, finished_at=_now(now), drafter_version=drafter_version, detail=detail)
            )

    def remember_delivery(self, delivery_id: str, now: datetime | None = None) -> bool:
        """Record a webhook delivery id; False when it was seen before (a replay). Old ids are forgotten."""
        now = _now(now)
        try:
            with self._session() as session:
                session.execute(delete(WebhookDelivery).where(WebhookDelivery.received_at < now - DELIVERY_MEMORY))
                session.add(WebhookDelivery(delivery_id=delivery_id[:200], received_at=now))
        except IntegrityError:
            return False
        return True

    def forget_delivery(self, delivery_id: str) -> None:
        """Undo `remember_delivery` for a delivery whose handling failed: the sender's retry is then no replay."""
        with self._session() as session:
            session.execute(delete(WebhookDelivery).where(WebhookDelivery.delivery_id == delivery_id[:200]))
