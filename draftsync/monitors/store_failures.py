"""How the monitor store's database fails while in use, classified into user-facing errors that carry their fix.

A database that is down, refuses the login, is read-only, full, busy or lacks a table shows as a SQLAlchemy
error with a driver message; `store_failure` names the store (password masked) and says what to do. Errors
that are the statement's own (IntegrityError above all) are left as they are. A SQLite write refused as
read-only drops its connection (`reopen_after_refused_write`), so the store recovers once the file is writable.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError

from draftsync.errors import DraftsyncError
from draftsync.redaction import masked_text, masked_url


def masked_first_line(exc: Exception, url: str) -> str:
    """The exception's first line, with the URL's credentials (if any) masked."""
    return masked_text((str(exc).strip().splitlines() or [type(exc).__name__])[0], url)


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
        frozenset({"42P01", "42703"}),
        ("no such table", "no such column"),
    ),
    StoreFailure(
        "is read-only",
        "make the database file and its folder writable by this user (SQLite writes a journal beside the file), or "
        "point DRAFTSYNC_MONITOR_DB_URL at a writable primary; after a refused write the store opens the file anew",
        frozenset({"25006"}),
        ("readonly database",),
    ),
    StoreFailure(
        "cannot read or write its storage",
        "check the disk and file system holding the database (full, remounted read-only, failing) and that this user "
        "may write the database file and its folder; the store opens the file anew on its next call",
        frozenset({"58030"}),
        ("disk i/o error",),
    ),
    StoreFailure(
        "is out of disk space",
        "free disk space where the database is stored (or grow its volume); the refused write changed nothing",
        frozenset({"53100"}),
        ("database or disk is full", "no space left on device"),
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
        frozenset({"40001", "40P01", "55P03"}),
        ("database is locked",),
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
    return DraftsyncError(
        f"monitor store {masked_url(url)} {failure.problem}: {masked_first_line(error, url)}", failure.fix
    )


def reopen_after_refused_write(context) -> None:
    """SQLite opens a file it may not write read-only and stays so: a write refused that way (or by an I/O error)
    drops the connection, so the next call opens the file anew and writes once it is writable again. The pre-ping
    is left alone."""
    message = str(context.original_exception).lower()
    if not context.is_pre_ping and ("readonly database" in message or "disk i/o error" in message):
        context.is_disconnect = True
