"""Watermarks: the last processed version per key (a target's registered-model name for the registry poll; a
deployment's capture file for the requests already booked, `draftsync.monitors.acceptance`)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.orm import Session

from draftsync.monitors.database import Repository
from draftsync.monitors.tables import Watermark, as_utc


def move_watermark(session: Session, key: str, version: int, now: datetime) -> None:
    """Set `key`'s watermark to `version` within `session`'s transaction (inserted when it has none)."""
    row = session.get(Watermark, key, with_for_update=True)
    if row is None:
        session.add(Watermark(key=key, version=int(version), updated_at=now))
    else:
        row.version = int(version)
        row.updated_at = now


class Watermarks(Repository):
    """The `watermarks` table of the monitor store."""

    def get(self, key: str) -> int | None:
        """The last processed version for `key`, or None if nothing was processed yet."""
        with self._database.transaction() as session:
            row = session.get(Watermark, key)
            return None if row is None else row.version

    def set(self, key: str, version: int, now: datetime | None = None) -> None:
        with self._database.transaction() as session:
            move_watermark(session, key, version, as_utc(now or datetime.now(UTC)))
