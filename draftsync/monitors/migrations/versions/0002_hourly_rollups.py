"""Hourly rollups: per (deployment, hour, served pair) sums that a week's report reads instead of raw samples.

A row with key `hour` sums the samples whose interval ends in (hour, hour + 1 h], the store's window
convention, so a window from one whole hour to another is exactly a range of rows. `drafter_version`
is 0 when speculation was off (MLflow versions start at 1): a key column cannot be NULL. The rows are
backfilled from the samples already stored, so a database from before this revision loses nothing.

Revision ID: 0002_hourly_rollups
Revises: 0001_initial_schema
Create Date: 2026-11-20
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

revision = "0002_hourly_rollups"
down_revision = "0001_initial_schema"
branch_labels = None
depends_on = None

HOUR = timedelta(hours=1)
BATCH = 20_000


def upgrade() -> None:
    moment = sa.DateTime(timezone=True)
    rollups = op.create_table(
        "hourly_rollups",
        sa.Column("deployment", sa.String(200), primary_key=True),
        sa.Column("hour", moment, primary_key=True),
        sa.Column("target_name", sa.String(200), primary_key=True),
        sa.Column("target_version", sa.Integer(), primary_key=True),
        sa.Column("drafter_version", sa.Integer(), primary_key=True),
        sa.Column("gamma", sa.Integer(), primary_key=True),
        sa.Column("intervals", sa.Integer(), nullable=False),
        sa.Column("resets", sa.Integer(), nullable=False),
        sa.Column("drafts", sa.BigInteger(), nullable=False),
        sa.Column("draft_tokens", sa.BigInteger(), nullable=False),
        sa.Column("accepted", sa.BigInteger(), nullable=False),
        sa.Column("accepted_per_position", sa.JSON(), nullable=False),
        sa.Column("generation_tokens", sa.BigInteger(), nullable=True),
        sa.Column("tpot_sum", sa.Float(), nullable=True),
        sa.Column("tpot_count", sa.BigInteger(), nullable=True),
        sa.Column("last_ts", moment, nullable=False),
    )
    op.create_index("ix_hourly_rollups_hour", "hourly_rollups", ["hour"])
    _backfill(rollups)


def downgrade() -> None:
    op.drop_index("ix_hourly_rollups_hour", table_name="hourly_rollups")
    op.drop_table("hourly_rollups")


def _backfill(rollups: sa.Table) -> None:
    """Sum the stored samples into hourly rows (in Python: per-position counts are JSON lists)."""
    bind = op.get_bind()
    sqlite = bind.dialect.name == "sqlite"
    samples = sa.table(
        "samples",
        *(
            sa.column(name)
            for name in (
                "deployment",
                "target_name",
                "target_version",
                "drafter_version",
                "gamma",
                "drafts",
                "draft_tokens",
                "accepted",
                "generation_tokens",
                "tpot_sum",
                "tpot_count",
                "reset",
            )
        ),
        sa.column("ts", sa.DateTime(timezone=True)),
        sa.column("accepted_per_position", sa.JSON()),
    )
    sums: dict[tuple, dict] = {}
    result = bind.execute(sa.select(samples).execution_options(yield_per=BATCH))
    for partition in result.mappings().partitions():
        for s in partition:
            ts = _utc(s["ts"])
            key = (
                s["deployment"],
                _hour_of(ts),
                s["target_name"],
                s["target_version"],
                s["drafter_version"] or 0,
                s["gamma"],
            )
            row = sums.get(key)
            if row is None:
                row = sums[key] = dict(
                    zip(
                        ("deployment", "hour", "target_name", "target_version", "drafter_version", "gamma"),
                        key,
                        strict=True,
                    ),
                    intervals=0,
                    resets=0,
                    drafts=0,
                    draft_tokens=0,
                    accepted=0,
                    accepted_per_position=[],
                    generation_tokens=None,
                    tpot_sum=None,
                    tpot_count=None,
                    last_ts=ts,
                )
            row["intervals"] += 1
            row["resets"] += 1 if s["reset"] else 0
            row["drafts"] += s["drafts"]
            row["draft_tokens"] += s["draft_tokens"]
            row["accepted"] += s["accepted"]
            per_position = row["accepted_per_position"]
            for i, count in enumerate(s["accepted_per_position"] or []):
                if i < len(per_position):
                    per_position[i] += count
                else:
                    per_position.append(count)
            for name in ("generation_tokens", "tpot_sum", "tpot_count"):
                if s[name] is not None:
                    row[name] = s[name] if row[name] is None else row[name] + s[name]
            row["last_ts"] = max(row["last_ts"], ts)
    rows = list(sums.values())
    for row in rows:
        for name in ("hour", "last_ts"):
            row[name] = row[name].replace(tzinfo=None) if sqlite else row[name]
    for first in range(0, len(rows), BATCH):
        bind.execute(rollups.insert(), rows[first : first + BATCH])


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _hour_of(ts: datetime) -> datetime:
    floor = ts.replace(minute=0, second=0, microsecond=0)
    return floor - HOUR if floor == ts else floor
