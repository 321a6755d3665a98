"""The monitor store's database failing while the store is in use: refused connections, a refused login, a missing
table, refused privileges, a read-only or full SQLite file. Each call then raises a DraftsyncError that names the
store (password masked) and says what to do, the SQLAlchemy error chained; once the database is back, the same store
object (and the sync ledger on it) works again, with every row written before still there."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from draftsync.errors import DraftsyncError
from draftsync.monitors.metrics import SpecDecodeCounters
from draftsync.monitors.store import Store
from draftsync.monitors.sync_jobs import SyncLedger
from draftsync.monitors.tables import ServedPair
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

START = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
PAIR = ServedPair(target_name="t", target_version=1, drafter_version=1, gamma=2)
PASSWORD = "pw-7d1e-never-shown"


def write_rows(store: Store, ledger: SyncLedger) -> None:
    """Rows of several tables, written before the fault, that must all survive it."""
    store.pairs.record(
        "chat",
        ServedPair(target_name="t", target_version=1, drafter_version=1, gamma=2, drafter_name="t-drafter"),
        endpoint="http://127.0.0.1:1",
        state="serving",
        now=START,
    )
    store.acceptance.record_scrape(
        "chat", START, SpecDecodeCounters(drafts=10, draft_tokens=20, accepted=15), PAIR, count_first=True
    )
    store.watermarks.set("t", 1, now=START)
    assert ledger.request("t", 1, "eagle3", source="test", reason="before the fault", now=START)


def assert_rows_kept(store: Store, ledger: SyncLedger) -> None:
    assert [p.deployment for p in store.pairs.all()] == ["chat"]
    assert [s.drafts for s in store.acceptance.samples("chat", START - timedelta(minutes=1), START)] == [10]
    assert store.watermarks.get("t") == 1
    assert [(j.target_name, j.target_version, j.status) for j in ledger.jobs()] == [("t", 1, "requested")]


def assert_store_error(error: DraftsyncError, store: Store, problem: str, fix: str) -> None:
    """Names the store (URL, password masked) and the problem, says the fix, chains the SQLAlchemy error."""
    from sqlalchemy import make_url

    shown = make_url(store.url).render_as_string(hide_password=True)
    assert f"monitor store {shown} {problem}" in error.what, error.what
    assert fix in error.fix, error.fix
    assert isinstance(error.__cause__, DBAPIError), repr(error.__cause__)
    assert not isinstance(error.__cause__, IntegrityError)
    assert PASSWORD not in str(error) and PASSWORD not in str(error.__cause__)


def faulty_calls(store: Store, ledger: SyncLedger) -> dict[str, Callable[[], object]]:
    """A read and a write of the store, and a read and a write of the ledger."""
    return {
        "store read": store.pairs.all,
        "store write": lambda: store.watermarks.set("t", 2, now=START + timedelta(hours=1)),
        "ledger read": ledger.jobs,
        "ledger write": lambda: ledger.request("t", 2, "eagle3", source="test", reason="during the fault", now=START),
    }


def assert_every_call_fails(store: Store, ledger: SyncLedger, problem: str, fix: str) -> None:
    for name, call in faulty_calls(store, ledger).items():
        with pytest.raises(DraftsyncError) as info:
            call()
        try:
            assert_store_error(info.value, store, problem, fix)
        except AssertionError as failure:
            raise AssertionError(f"{name}: {failure}") from None


# --- Postgres ------------------------------------------------------------------------------------
@dataclass
class MonitorDatabase:
    """A database of its own on the session's cluster, owned by a login role with a password (trust auth ignores
    it, but the store's URL carries it): the superuser connection breaks and mends it while the store is in use."""

    server: object
    name: str
    role: str

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{self.role}:{PASSWORD}@{self.server.host}:{self.server.port}/{self.name}"

    def admin(self, *statements: str, database: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(
            host=self.server.host, port=self.server.port, user=self.server.user, dbname=database, autocommit=True
        ) as connection:
            for statement in statements:
                connection.execute(statement)

    def cut_sessions(self) -> None:
        """Ends the store's open connections, as a failover or an operator would."""
        self.admin(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{self.name}' "
            "AND pid <> pg_backend_pid()"
        )

    @contextmanager
    def broken(self, breaking: list[str], mending: list[str], database: str = "postgres") -> Iterator[None]:
        self.admin(*breaking, database=database)
        self.cut_sessions()
        try:
            yield
        finally:
            self.admin(*mending, database=database)


@pytest.fixture
def monitor_database(postgres_server) -> Iterator[MonitorDatabase]:
    suffix = uuid.uuid4().hex[:10]
    database = MonitorDatabase(postgres_server, f"monitor_{suffix}", f"monitor_{suffix}")
    database.admin(
        f"CREATE ROLE {database.role} LOGIN PASSWORD '{PASSWORD}'",
        f"CREATE DATABASE {database.name} OWNER {database.role}",
    )
    try:
        yield database
    finally:
        database.admin(f"DROP DATABASE IF EXISTS {database.name} WITH (FORCE)", f"DROP ROLE IF EXISTS {database.role}")


@contextmanager
def store_with_rows(url: str) -> Iterator[tuple[Store, SyncLedger]]:
    """The store and its ledger on `url`, holding the rows every test checks are kept; closed afterwards."""
    store = Store(url)
    try:
        ledger = store.ledger
        write_rows(store, ledger)
        yield store, ledger
    finally:
        store.close()


@pytest.fixture
def postgres_store(monitor_database) -> Iterator[tuple[Store, SyncLedger]]:
    with store_with_rows(monitor_database.url) as opened:
        yield opened


def test_postgres_refusing_connections_is_a_clear_error_and_the_store_reconnects_after(
    monitor_database, postgres_store
):
    """The database stops accepting connections and the store's sessions are cut: each call fails with the store
    named and `start the database`; allowed again, the same store and ledger work and nothing was lost."""
    store, ledger = postgres_store
    with monitor_database.broken(
        [f"ALTER DATABASE {monitor_database.name} WITH ALLOW_CONNECTIONS false"],
        [f"ALTER DATABASE {monitor_database.name} WITH ALLOW_CONNECTIONS true"],
    ):
        assert_every_call_fails(store, ledger, "is unavailable", "start the database")
        with pytest.raises(DraftsyncError) as info:
            store.watermarks.get("t")
        assert "is not currently accepting connections" in info.value.what
        assert isinstance(info.value.__cause__, OperationalError)
    assert_rows_kept(store, ledger)
    store.watermarks.set("t", 2, now=START + timedelta(hours=1))
    assert store.watermarks.get("t") == 2


def test_postgres_refusing_the_login_is_a_clear_error_naming_the_user_and_password_fix(
    monitor_database, postgres_store
):
    store, ledger = postgres_store
    with monitor_database.broken(
        [f"ALTER ROLE {monitor_database.role} NOLOGIN"], [f"ALTER ROLE {monitor_database.role} LOGIN"]
    ):
        assert_every_call_fails(store, ledger, "refused access", "check the user and password")
    assert_rows_kept(store, ledger)


def test_postgres_revoked_table_privileges_are_a_clear_error(monitor_database, postgres_store):
    store, ledger = postgres_store
    tables = "serving_pairs, watermarks, sync_jobs"
    with monitor_database.broken(
        [f"REVOKE ALL ON {tables} FROM {monitor_database.role}"],
        [f"GRANT ALL ON {tables} TO {monitor_database.role}"],
        database=monitor_database.name,
    ):
        assert_every_call_fails(store, ledger, "refused access", "GRANT")
    assert_rows_kept(store, ledger)


def test_postgres_tables_missing_say_to_run_the_migrations(monitor_database, postgres_store):
    """A table gone (migrations not run on this database, or it was moved away): the fix says to run them."""
    store, ledger = postgres_store
    moved = ["serving_pairs", "watermarks", "sync_jobs"]
    with monitor_database.broken(
        [f"ALTER TABLE {t} RENAME TO {t}_away" for t in moved],
        [f"ALTER TABLE {t}_away RENAME TO {t}" for t in moved],
        database=monitor_database.name,
    ):
        assert_every_call_fails(store, ledger, "lacks a table or column", "run the migrations")
    assert_rows_kept(store, ledger)


def test_postgres_sessions_cut_between_two_calls_cost_a_reconnect_not_an_error(monitor_database, postgres_store):
    """The pre-ping finds the dead pooled connection and the store reconnects: no error at all."""
    store, ledger = postgres_store
    monitor_database.cut_sessions()
    assert_rows_kept(store, ledger)
    monitor_database.cut_sessions()
    store.watermarks.set("t", 3, now=START + timedelta(hours=2))
    assert ledger.request("t", 2, "eagle3", source="test", reason="after a cut", now=START)
    assert store.watermarks.get("t") == 3


def test_the_ledger_still_sees_a_duplicate_delivery_as_an_integrity_error_turned_replay(postgres_store):
    """The ledger relies on IntegrityError for its replay check; the store's error translation leaves it alone."""
    _, ledger = postgres_store
    assert ledger.remember_delivery("delivery-1", now=START)
    assert not ledger.remember_delivery("delivery-1", now=START)


# --- SQLite --------------------------------------------------------------------------------------
@pytest.fixture
def sqlite_store(tmp_path) -> Iterator[tuple[Store, SyncLedger]]:
    with store_with_rows(f"sqlite:///{tmp_path / 'monitor.db'}") as opened:
        yield opened


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """The file made read-only: its mode for a normal user; the immutable flag for root, whom modes do not stop."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"running as root and `chattr +i` is refused here ({made.stderr.strip()}): no read-only file")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True, capture_output=True)


def test_a_read_only_sqlite_file_is_a_clear_error_naming_the_file_and_writes_resume_when_writable(tmp_path):
    """The store is opened on a file it may not write (SQLite then opens it read-only): reads work, each write fails
    naming the file; once the file is writable again the same store writes, and nothing was lost."""
    path = tmp_path / "monitor.db"
    first = Store(f"sqlite:///{path}")
    write_rows(first, first.ledger)
    first.close()
    with ExitStack() as writable_again:
        writable_again.enter_context(read_only(path))
        store = Store(f"sqlite:///{path}")  # the schema is current: opening needs no write
        ledger = store.ledger
        try:
            assert_rows_kept(store, ledger)
            for name, call in faulty_calls(store, ledger).items():
                if name.endswith("read"):
                    call()
                    continue
                with pytest.raises(DraftsyncError) as info:
                    call()
                assert f"sqlite:///{path} is read-only" in info.value.what, name
                assert "attempt to write a readonly database" in info.value.what
                assert_store_error(info.value, store, "is read-only", "make the database file and its folder writable")
            writable_again.close()
            store.watermarks.set("t", 2, now=START + timedelta(hours=1))
            assert ledger.request("t", 2, "eagle3", source="test", reason="writable again", now=START)
            assert store.watermarks.get("t") == 2
            assert len(ledger.jobs()) == 2
        finally:
            store.close()


def test_sqlite_tables_missing_say_to_run_the_migrations(sqlite_store, tmp_path):
    store, ledger = sqlite_store
    moved = ["serving_pairs", "watermarks", "sync_jobs"]
    with sqlite3.connect(tmp_path / "monitor.db") as connection:
        for table in moved:
            connection.execute(f"ALTER TABLE {table} RENAME TO {table}_away")
    assert_every_call_fails(store, ledger, "lacks a table or column", "run the migrations")
    with sqlite3.connect(tmp_path / "monitor.db") as connection:
        for table in moved:
            connection.execute(f"ALTER TABLE {table}_away RENAME TO {table}")
    assert_rows_kept(store, ledger)


def test_a_full_sqlite_database_is_a_clear_error_and_the_refused_write_changed_nothing(sqlite_store):
    """SQLite's page limit stands in for a full disk (SQLITE_FULL either way): the write that needs a new page
    fails naming the store; with room again it succeeds, and the refused one left no row."""
    store, ledger = sqlite_store
    limit = {"pages": None}

    @event.listens_for(store.engine, "checkout")
    def cap_the_size(dbapi_connection, _record, _proxy):
        pages = limit["pages"] or 1073741823  # SQLite's default maximum
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

    with store.engine.connect() as connection:
        limit["pages"] = connection.exec_driver_sql("PRAGMA page_count").scalar()
    big = "x" * 200_000  # needs overflow pages
    with pytest.raises(DraftsyncError) as info:
        store.outbox.add(
            subject=big, recipients=["a@example.org"], eml_path="/nowhere.eml", message=b"", created_at=START
        )
    assert_store_error(info.value, store, "is out of disk space", "free disk space")
    assert "database or disk is full" in info.value.what
    assert store.outbox.entries() == []
    limit["pages"] = None
    entry = store.outbox.add(
        subject=big, recipients=["a@example.org"], eml_path="/nowhere.eml", message=b"", created_at=START
    )
    assert [e.id for e in store.outbox.entries()] == [entry.id]
    assert_rows_kept(store, ledger)
