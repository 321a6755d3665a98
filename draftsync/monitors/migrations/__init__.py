"""Schema migrations of the monitor store (Alembic), applied by the store itself when it is opened.

`Store(url)` calls `upgrade_to_head`: a new database gets every revision; an unversioned one (no
alembic_version table) that already holds a table of the store's is refused, since draftsync did not make
it. Concurrent openers are serialised: a Postgres advisory lock, or SQLite's write lock (BEGIN IMMEDIATE),
so only one of them migrates. There is no alembic.ini;
`alembic_config(connection)` builds the Config in code for `alembic.command` calls by hand.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text

from draftsync.errors import DraftsyncError

if TYPE_CHECKING:
    from alembic.config import Config

SCRIPT_LOCATION = "draftsync.monitors:migrations"
INITIAL_TABLES = frozenset({"samples", "scrape_state", "watermarks", "serving_pairs", "outbox", "alerts"})
ADVISORY_LOCK_KEY = 7237970109966637422  # b"draftsyn" as a bigint: one lock per database for migrating it


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's Config for the store's migrations; `connection` is the one env.py migrates."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@functools.cache
def _revisions() -> tuple[str, frozenset[str]]:
    """The head revision and every known revision id (read once per process)."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    head = script.get_current_head()
    assert head is not None, "the migrations directory ships its revisions"
    return head, frozenset(r.revision for r in script.walk_revisions())


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at; None when it has no alembic_version table."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


def upgrade_to_head(engine: Engine) -> str | None:
    """Bring the database to the head revision; returns the revision it was at before (None: unversioned).

    A database already at head costs one query. Otherwise the check is repeated under the lock, so a
    second opener that waited finds the work done.
    """
    from alembic import command

    head, known = _revisions()
    with engine.connect() as connection:
        before = current_revision(connection)
    if before == head:
        return before
    with _exclusive(engine) as connection:
        before = current_revision(connection)
        if before == head:
            return before
        if before is not None and before not in known:
            raise DraftsyncError(
                f"monitor store schema is at revision {before!r}, which this draftsync does not know (head {head!r})",
                "a newer draftsync migrated this database: upgrade draftsync, or point DRAFTSYNC_MONITOR_DB_URL "
                "at another database",
            )
        if before is None:
            _refuse_foreign_tables(connection)
        command.upgrade(alembic_config(connection), "head")
    return before


def _refuse_foreign_tables(connection: Connection) -> None:
    """Every store draftsync made has an alembic_version table: tables of the store's names without one belong
    to something else, and migrating would fail on them or write into them."""
    present = INITIAL_TABLES & set(inspect(connection).get_table_names())
    if present:
        raise DraftsyncError(
            f"monitor store database has the tables {sorted(present)} but no alembic_version table",
            "draftsync did not make this database: point DRAFTSYNC_MONITOR_DB_URL at an empty database or at a "
            "monitor store draftsync created",
        )


@contextlib.contextmanager
def _exclusive(engine: Engine) -> Iterator[Connection]:
    """One transaction that only one process at a time holds for migrating this database."""
    if engine.dialect.name == "sqlite":
        # pysqlite defers BEGIN until the first write; take the write lock before reading the revision.
        with engine.connect() as connection:
            connection.execution_options(isolation_level="AUTOCOMMIT")
            connection.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield connection
            except BaseException:
                connection.exec_driver_sql("ROLLBACK")
                raise
            connection.exec_driver_sql("COMMIT")
        return
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
        yield connection
