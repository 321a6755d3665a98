"""The outbox keeps each message itself, not only the path of its `.eml` file.

A flow run on a docker or kubernetes work pool writes the `.eml` into its own container, which is gone when a later
run retries the delivery: the retry found no file and gave up on the message. The message now lies in the store,
which every run shares; the file stays, for people to read.

Revision ID: 0005_outbox_messages
Revises: 0004_request_acceptance
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_outbox_messages"
down_revision = "0004_request_acceptance"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outbox") as table:
        table.add_column(sa.Column("message", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox") as table:
        table.drop_column("message")
