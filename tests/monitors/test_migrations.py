"""The monitor store's Alembic migrations on SQLite and on a real Postgres: new databases, databases made by the
old create_all code, concurrent openers, downgrade, and databases the store must not touch."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from draftsync.errors import DraftsyncError
from draftsync.monitors import sync_jobs  # noqa: F401  (registers its tables on Base.metadata)
from draftsync.monitors.metrics import SpecDecodeCounters
from draftsync.monitors.migrations import INITIAL_REVISION, alembic_config, current_revision, head_revision
from draftsync.monitors.rollups import hourly_rows
from draftsync.monitors.store import Store
from draftsync.monitors.tables import Base, ServedPair

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def legacy_metadata() -> sa.MetaData:
    """The schema `Store` made with create_all before it had migrations, frozen here as it was."""
    moment = sa.DateTime(timezone=True)
    metadata = sa.MetaData()
    sa.Table(
        "samples",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("ts", moment, nullable=False),
        sa.Column("interval_start", moment, nullable=False),
        sa.Column("target_name", sa.String(200), nullable=False),
        sa.Column("target_version", sa.Integer, nullable=False),
        sa.Column("drafter_version", sa.Integer, nullable=True),
        sa.Column("gamma", sa.Integer, nullable=False),
        sa.Column("drafts", sa.Integer, nullable=False),
        sa.Column("draft_tokens", sa.Integer, nullable=False),
        sa.Column("accepted", sa.Integer, nullable=False),
        sa.Column("accepted_per_position", sa.JSON, nullable=False),
        sa.Column("generation_tokens", sa.Integer, nullable=True),
        sa.Column("tpot_sum", sa.Float, nullable=True),
        sa.Column("tpot_count", sa.Integer, nullable=True),
        sa.Column("reset", sa.Boolean, nullable=False),
        sa.Index("ix_samples_deployment_ts", "deployment", "ts"),
    )
    sa.Table(
        "scrape_state",
        metadata,
        sa.Column("deployment", sa.String(200), primary_key=True),
        sa.Column("ts", moment, nullable=False),
        sa.Column("counters", sa.JSON, nullable=False),
    )
    sa.Table(
        "watermarks",
        metadata,
        sa.Column("key", sa.String(300), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("updated_at", moment, nullable=False),
    )
    sa.Table(
        "serving_pairs",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("deployment", sa.String(200), nullable=False, unique=True),
        sa.Column("target_name", sa.String(200), nullable=False),
        sa.Column("target_version", sa.Integer, nullable=False),
        sa.Column("drafter_name", sa.String(200), nullable=True),
        sa.Column("drafter_version", sa.Integer, nullable=True),
        sa.Column("gamma", sa.Integer, nullable=False),
        sa.Column("endpoint", sa.String(500), nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("updated_at", moment, nullable=False),
    )
    sa.Table(
        "outbox",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("created_at", moment, nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("recipients", sa.Text, nullable=False),
        sa.Column("eml_path", sa.Text, nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("sent_at", moment, nullable=True),
    )
    sa.Table(
        "alerts",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("key", sa.String(300), nullable=False),
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("rule", sa.String(100), nullable=False),
        sa.Column("severity", sa.String(20), nullable=False),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("sent_at", moment, nullable=False),
        sa.Column("outbox_id", sa.Integer, sa.ForeignKey("outbox.id"), nullable=True),
        sa.Index("ix_alerts_key_sent_at", "key", "sent_at"),
    )
    return metadata


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
    assert revision_of(url) == head_revision() == "0003_sync_jobs"
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        differences = compare_metadata(
            MigrationContext.configure(connection, opts={"compare_type": True}), Base.metadata
        )
    engine.dispose()
    assert differences == []


def test_the_initial_revision_is_the_schema_create_all_made(new_url):
    from alembic import command

    legacy_url, migrated_url = new_url(), new_url()
    engine = sa.create_engine(legacy_url)
    legacy_metadata().create_all(engine)
    engine.dispose()
    engine = sa.create_engine(migrated_url)
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), INITIAL_REVISION)
    engine.dispose()
    assert schema(migrated_url) == schema(legacy_url)
    assert len(schema(legacy_url)) == 6


def test_a_database_made_by_create_all_is_adopted_with_its_rows(new_url):
    url = new_url()
    engine = sa.create_engine(url)
    metadata = legacy_metadata()
    metadata.create_all(engine)
    t = metadata.tables
    sample = dict(
        target_name="demo",
        target_version=1,
        gamma=3,
        drafts=10,
        draft_tokens=30,
        generation_tokens=None,
        tpot_sum=None,
        tpot_count=None,
        reset=False,
    )
    with engine.begin() as connection:
        connection.execute(
            t["samples"].insert(),
            [
                dict(
                    sample,
                    deployment="dep",
                    ts=T0 + timedelta(minutes=30),
                    interval_start=T0,
                    drafter_version=1,
                    accepted=20,
                    accepted_per_position=[9, 7, 4],
                ),
                dict(
                    sample,
                    deployment="dep",
                    ts=T0 + timedelta(hours=1),
                    interval_start=T0 + timedelta(minutes=30),
                    drafter_version=1,
                    accepted=12,
                    accepted_per_position=[6, 4, 2],
                    generation_tokens=40,
                    tpot_sum=0.5,
                    tpot_count=40,
                ),
                dict(
                    sample,
                    deployment="dep",
                    ts=T0 + timedelta(hours=1, minutes=1),
                    interval_start=T0 + timedelta(hours=1),
                    drafter_version=None,
                    gamma=0,
                    drafts=0,
                    draft_tokens=0,
                    accepted=0,
                    accepted_per_position=[],
                    reset=True,
                ),
            ],
        )
        connection.execute(
            t["scrape_state"].insert(),
            [
                dict(
                    deployment="dep",
                    ts=T0 + timedelta(hours=1, minutes=1),
                    counters=SpecDecodeCounters(50, 150, 90, (40, 30, 20)).to_dict(),
                )
            ],
        )
        connection.execute(t["watermarks"].insert(), [dict(key="demo", version=2, updated_at=T0)])
        connection.execute(
            t["serving_pairs"].insert(),
            [
                dict(
                    deployment="dep",
                    target_name="demo",
                    target_version=1,
                    drafter_name="demo-drafter",
                    drafter_version=1,
                    gamma=3,
                    endpoint="http://127.0.0.1:9000",
                    state="serving",
                    updated_at=T0,
                )
            ],
        )
        connection.execute(
            t["outbox"].insert(),
            [
                dict(
                    id=1,
                    created_at=T0,
                    subject="s",
                    recipients="a@x",
                    eml_path="/tmp/a.eml",
                    status="pending",
                    attempts=0,
                )
            ],
        )
        connection.execute(
            t["alerts"].insert(),
            [
                dict(
                    key="dep:stale",
                    deployment="dep",
                    rule="stale",
                    severity="critical",
                    value=0.4,
                    sent_at=T0,
                    outbox_id=1,
                )
            ],
        )
    engine.dispose()
    assert revision_of(url) is None

    store = Store(url)
    try:
        assert revision_of(url) == head_revision()
        kept = store.samples("dep", T0, T0 + timedelta(hours=2))
        assert [(s.accepted, s.drafter_version, s.reset) for s in kept] == [
            (20, 1, False),
            (12, 1, False),
            (0, None, True),
        ]
        assert store.get_watermark("demo") == 2
        assert store.serving_pair("dep").endpoint == "http://127.0.0.1:9000"
        assert [(a.rule, a.outbox_id) for a in store.alerts("dep")] == [("stale", 1)]
        assert [e.subject for e in store.outbox("pending")] == ["s"]

        # the rollups were backfilled from the samples: the on-the-hour sample counts in the hour it ends
        rows = store.hourly("dep", T0, T0 + timedelta(hours=2))
        assert rows == hourly_rows(kept)
        assert [(r.hour, r.intervals, r.accepted, r.accepted_per_position, r.drafter_version) for r in rows] == [
            (T0, 2, 32, [15, 11, 6], 1),
            (T0 + timedelta(hours=1), 1, 0, [], None),
        ]
        assert (rows[0].generation_tokens, rows[0].tpot_count, rows[1].resets) == (40, 40, 1)

        # the stored baseline is kept: the next scrape is a delta against it, booked into the same hour row
        pair = ServedPair("demo", 1, 1, 3)
        after = store.record_scrape(
            "dep", T0 + timedelta(hours=1, minutes=2), SpecDecodeCounters(60, 180, 110, (47, 37, 26)), pair
        )
        assert (after.drafts, after.accepted, after.reset) == (10, 20, False)
        assert store.hourly("dep", T0 + timedelta(hours=1), T0 + timedelta(hours=2))[-1].accepted == 20
    finally:
        store.close()
    Store(url).close()  # opening it again is a no-op
    assert revision_of(url) == head_revision()


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
        store.record_scrape(
            "dep", T0 + timedelta(minutes=minute), SpecDecodeCounters(minute, 2 * minute, minute, (minute,)), pair
        )
    before = store.hourly("dep", T0, T0 + timedelta(hours=3))
    store.close()

    engine = sa.create_engine(url)
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), INITIAL_REVISION)
    engine.dispose()
    assert "hourly_rollups" not in schema(url)

    store = Store(url)
    try:
        assert store.hourly("dep", T0, T0 + timedelta(hours=3)) == before
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
