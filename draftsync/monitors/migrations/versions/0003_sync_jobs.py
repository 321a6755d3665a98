"""Sync jobs and webhook deliveries: the idempotency keys of the production loop.

`sync_jobs` holds one row per (target, version, method): whoever inserts it (a webhook, the registry
poll, a stale finding) is the one that asks for the sync, so duplicate triggers make one sync.
`webhook_deliveries` remembers MLflow delivery ids for the receiver's replay check.

Revision ID: 0003_sync_jobs
Revises: 0002_hourly_rollups
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_sync_jobs"
down_revision = "0002_hourly_rollups"
branch_labels = None
depends_on = None


def upgrade() -> None:
    moment = sa.DateTime(timezone=True)
    op.create_table(
        "sync_jobs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("target_name", sa.String(200), nullable=False),
        sa.Column("target_version", sa.Integer(), nullable=False),
        sa.Column("method", sa.String(20), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(50), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("requested_at", moment, nullable=False),
        sa.Column("started_at", moment, nullable=True),
        sa.Column("finished_at", moment, nullable=True),
        sa.Column("run_id", sa.String(100), nullable=True),
        sa.Column("drafter_version", sa.Integer(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.UniqueConstraint("target_name", "target_version", "method", name="uq_sync_jobs_key"),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("delivery_id", sa.String(200), primary_key=True),
        sa.Column("received_at", moment, nullable=False),
    )
    op.create_index("ix_webhook_deliveries_received_at", "webhook_deliveries", ["received_at"])


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_received_at", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_table("sync_jobs")
