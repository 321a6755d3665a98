"""The monitor store's Alembic migrations on SQLite and on a real Postgres: new databases, concurrent openers,
downgrade, and databases the store must not touch."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from draftsync.errors import DraftsyncError
from draftsync.monitors import sync_jobs  # noqa: F401  (registers its tables on Base.metadata)
from draftsync.monitors.metrics import SpecDecodeCounters
from draftsync.monitors.migrations import alembic_config, current_revision
from draftsync.monitors.store import Store
from draftsync.monitors.tables import Base, ServedPair

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def new_url(request, tmp_path):
    """A factory of URLs of fresh, empty databases on one engine."""
    if request.param == "sqlite":
        counter = iter(range(100))
        return lambda: f"sqlite:///{tmp_path / f'monitor-{next(counter)}.db'}"
    server = request.getfixturevalue("postgres_server")
    return server.create_database


def schema(url: str) -> dict:
    """Tables, columns (type, nullability), keys, indexes and unique constraints, as the database reports them."""
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        described = {}
        for table in sorted(set(inspector.get_table_names()) - {"alembic_version"}):
            described[table] = {
                "columns": [(c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns(table)],
                "primary_key": inspector.get_pk_constraint(table)["constrained_columns"],
                "foreign_keys": sorted(
                    (tuple(k["constrained_columns"]), k["referred_table"], tuple(k["referred_columns"]))
                    for k in inspector.get_foreign_keys(table)
                ),
                "indexes": sorted(
                    (i["name"], tuple(i["column_names"]), bool(i["unique"])) for i in inspector.get_indexes(table)
                ),
                "unique": sorted(tuple(u["column_names"]) for u in inspector.get_unique_constraints(table)),
            }
        return described
    finally:
        engine.dispose()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def revision_of(url: str) -> str | None:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return current_revision(connection)
    finally:
        engine.dispose()


def test_a_new_database_is_migrated_to_head_and_matches_the_models(new_url):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    url = new_url()
    Store(url).close()
    assert revision_of(url) == head_revision() == "0005_outbox_messages"
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        differences = compare_metadata(
            MigrationContext.configure(connection, opts={"compare_type": True}), Base.metadata
        )
    engine.dispose()
    assert differences == []


def test_concurrent_first_opens_migrate_once(new_url):
    url = new_url()
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_store() -> None:
        start.wait()
        try:
            Store(url).close()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert revision_of(url) == head_revision()
    assert "hourly_rollups" in schema(url)


def test_downgrade_then_reopen_rebuilds_the_rollups(new_url):
    from alembic import command

    url = new_url()
    store = Store(url)
    pair = ServedPair("demo", 1, 2, 2)
    for minute in range(0, 150, 10):
        store.acceptance.record_scrape(
            "dep", T0 + timedelta(minutes=minute), SpecDecodeCounters(minute, 2 * minute, minute, (minute,)), pair
        )
    before = store.acceptance.hourly("dep", T0, T0 + timedelta(hours=3))
    store.close()

    engine = sa.create_engine(url)
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0001_initial_schema")
    engine.dispose()
    assert "hourly_rollups" not in schema(url)

    store = Store(url)
    try:
        assert store.acceptance.hourly("dep", T0, T0 + timedelta(hours=3)) == before
        assert sum(r.accepted for r in before) == 140
    finally:
        store.close()


def test_a_database_from_a_newer_draftsync_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'monitor.db'}"
    Store(url).close()
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE alembic_version SET version_num = '0099_from_the_future'"))
    engine.dispose()
    with pytest.raises(DraftsyncError, match="0099_from_the_future") as info:
        Store(url)
    assert "upgrade draftsync" in info.value.fix


def test_tables_of_another_application_are_not_adopted(tmp_path):
    url = f"sqlite:///{tmp_path / 'other.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE samples (id INTEGER PRIMARY KEY, payload TEXT)"))
        connection.execute(sa.text("INSERT INTO samples (payload) VALUES ('theirs')"))
    engine.dispose()
    with pytest.raises(DraftsyncError, match="did not make this database|but not"):
        Store(url)
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT payload FROM samples")).scalars().all() == ["theirs"]
        assert not sa.inspect(connection).has_table("alembic_version")
    engine.dispose()


def test_the_migrations_ship_inside_the_package():
    from importlib.resources import files

    folder = files("draftsync.monitors") / "migrations"
    names = {entry.name for entry in (folder / "versions").iterdir()}
    assert {"0001_initial_schema.py", "0002_hourly_rollups.py"} <= names
    assert (folder / "env.py").is_file() and (folder / "script.py.mako").is_file()
