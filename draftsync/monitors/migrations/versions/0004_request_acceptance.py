"""Per-request acceptance: each captured request's drafted and accepted tokens, booked by the scrape that read it.

The scrape counters pool a deployment's requests; percentiles per client domain and per served pair need the
requests themselves. The router's capture file holds them for a retrain; the scrape copies their acceptance (never
the prompt) here, at the monitor's clock, attributed to the pair serving then.

Revision ID: 0004_request_acceptance
Revises: 0003_sync_jobs
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_request_acceptance"
down_revision = "0003_sync_jobs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "request_acceptance",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("target_version", sa.Integer(), nullable=False),
        sa.Column("drafter_version", sa.Integer(), nullable=True),
        sa.Column("domain", sa.String(64), nullable=True),
        sa.Column("draft_tokens", sa.Integer(), nullable=False),
        sa.Column("accepted", sa.Integer(), nullable=False),
    )
    op.create_index("ix_request_acceptance_deployment_ts", "request_acceptance", ["deployment", "ts"])


def downgrade() -> None:
    op.drop_index("ix_request_acceptance_deployment_ts", table_name="request_acceptance")
    op.drop_table("request_acceptance")
