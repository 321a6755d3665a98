"""The monitor store's database: the engine, the schema migrated when it is opened, and the one transaction.

SQLite by default, Postgres in production (`postgresql+psycopg://...`). The schema is migrated with Alembic
when the database is opened (`draftsync.monitors.migrations`). Every read and write of every record kind runs in
`Database.transaction()`, the one place where a database failing while in use becomes a DraftsyncError naming
the store, password masked (what it raises is classified in `draftsync.monitors.store_failures`). The record
kinds themselves are in `draftsync.monitors.store`, each a `Repository` over the one database.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from sqlalchemy import create_engine, event
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from draftsync.errors import DraftsyncError
from draftsync.monitors.migrations import upgrade_to_head
from draftsync.monitors.store_failures import masked_first_line, reopen_after_refused_write, store_failure
from draftsync.redaction import masked_url


def _utc_session(dbapi_connection, _record) -> None:
    """Postgres returns times in the session's zone: in UTC the driver hands back datetime.UTC, cheapest to read."""
    cursor = dbapi_connection.cursor()
    cursor.execute("SET TIME ZONE 'UTC'")
    cursor.close()
    dbapi_connection.commit()


def dialect_insert(dialect: str):
    """The INSERT of `dialect` that knows ON CONFLICT (Postgres and SQLite both do)."""
    from sqlalchemy.dialects import postgresql, sqlite

    return postgresql.insert if dialect == "postgresql" else sqlite.insert


class Database:
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


class Repository:
    """One kind of record in the monitor database; its calls run in the database's `transaction()`."""

    def __init__(self, database: Database):
        self._database = database
