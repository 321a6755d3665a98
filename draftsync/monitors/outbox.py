"""The e-mail outbox: one row per message the mailer wrote (`draftsync.monitors.mailer`), with its delivery state."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update

from draftsync.errors import DraftsyncError
from draftsync.monitors.database import Repository
from draftsync.monitors.tables import OutboxEntry, OutboxStatus, as_utc, updated_rows


class Outbox(Repository):
    """The `outbox` table of the monitor store."""

    def add(
        self, *, subject: str, recipients: list[str], eml_path: str, message: bytes, created_at: datetime
    ) -> OutboxEntry:
        with self._database.transaction() as session:
            row = OutboxEntry(
                created_at=as_utc(created_at),
                subject=subject,
                recipients=",".join(recipients),
                eml_path=eml_path,
                message=message,
                status="pending",
                attempts=0,
            )
            session.add(row)
            return row

    def entries(self, status: OutboxStatus | None = None) -> list[OutboxEntry]:
        """The messages (those in `status`, when given), oldest first."""
        with self._database.transaction() as session:
            query = select(OutboxEntry).order_by(OutboxEntry.id)
            if status is not None:
                query = query.where(OutboxEntry.status == status)
            return list(session.scalars(query).all())

    def entry(self, entry_id: int) -> OutboxEntry | None:
        with self._database.transaction() as session:
            return session.get(OutboxEntry, entry_id)

    def claim(self, entry_id: int, seen_attempts: int) -> bool:
        """Count a delivery attempt, only if nobody else has started one since we read the entry.

        Two retry loops racing over the same pending e-mail: exactly one wins the claim.
        """
        with self._database.transaction() as session:
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

    def mark(
        self, entry_id: int, status: OutboxStatus, *, error: str | None = None, sent_at: datetime | None = None
    ) -> OutboxEntry:
        with self._database.transaction() as session:
            row = session.get(OutboxEntry, entry_id, with_for_update=True)
            if row is None:
                raise DraftsyncError(f"outbox entry {entry_id}", "it is not in the monitor store; was the store reset?")
            row.status = status
            row.last_error = error
            if sent_at is not None:
                row.sent_at = as_utc(sent_at)
            return row
