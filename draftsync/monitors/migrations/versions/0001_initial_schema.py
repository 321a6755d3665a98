"""Initial schema: samples, scrape state, watermarks, serving pairs, the outbox and alerts.

Revision ID: 0001_initial_schema
Revises:
Create Date: 2026-11-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial_schema"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    moment = sa.DateTime(timezone=True)
    op.create_table(
        "samples",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("ts", moment, nullable=False),
        sa.Column("interval_start", moment, nullable=False),
        sa.Column("target_name", sa.String(200), nullable=False),
        sa.Column("target_version", sa.Integer(), nullable=False),
        sa.Column("drafter_version", sa.Integer(), nullable=True),
        sa.Column("gamma", sa.Integer(), nullable=False),
        sa.Column("drafts", sa.Integer(), nullable=False),
        sa.Column("draft_tokens", sa.Integer(), nullable=False),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("accepted_per_position", sa.JSON(), nullable=False),
        sa.Column("generation_tokens", sa.Integer(), nullable=True),
        sa.Column("tpot_sum", sa.Float(), nullable=True),
        sa.Column("tpot_count", sa.Integer(), nullable=True),
        sa.Column("reset", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_samples_deployment_ts", "samples", ["deployment", "ts"])
    op.create_table(
        "scrape_state",
        sa.Column("deployment", sa.String(200), primary_key=True),
        sa.Column("ts", moment, nullable=False),
        sa.Column("counters", sa.JSON(), nullable=False),
    )
    op.create_table(
        "watermarks",
        sa.Column("key", sa.String(300), primary_key=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", moment, nullable=False),
    )
    op.create_table(
        "serving_pairs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("target_name", sa.String(200), nullable=False),
        sa.Column("target_version", sa.Integer(), nullable=False),
        sa.Column("drafter_name", sa.String(200), nullable=True),
        sa.Column("drafter_version", sa.Integer(), nullable=True),
        sa.Column("gamma", sa.Integer(), nullable=False),
        sa.Column("endpoint", sa.String(500), nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("updated_at", moment, nullable=False),
        sa.UniqueConstraint("deployment"),
    )
    op.create_table(
        "outbox",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("created_at", moment, nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("recipients", sa.Text(), nullable=False),
        sa.Column("eml_path", sa.Text(), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("sent_at", moment, nullable=True),
    )
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("key", sa.String(300), nullable=False),
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("rule", sa.String(100), nullable=False),
        sa.Column("severity", sa.String(20), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("sent_at", moment, nullable=False),
        sa.Column("outbox_id", sa.Integer(), sa.ForeignKey("outbox.id"), nullable=True),
    )
    op.create_index("ix_alerts_key_sent_at", "alerts", ["key", "sent_at"])


def downgrade() -> None:
    op.drop_index("ix_alerts_key_sent_at", table_name="alerts")
    op.drop_table("alerts")
    op.drop_table("outbox")
    op.drop_table("serving_pairs")
    op.drop_table("watermarks")
    op.drop_table("scrape_state")
    op.drop_index("ix_samples_deployment_ts", table_name="samples")
    op.drop_table("samples")
