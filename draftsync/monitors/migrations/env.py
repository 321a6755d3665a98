"""Alembic environment of the monitor store: runs on the connection that `upgrade_to_head` hands over.

The store migrates itself when it is opened (`Store(url)`); there is no alembic.ini. To run Alembic by
hand, build the same Config in code: `draftsync.monitors.migrations.alembic_config(connection)`.
"""

from __future__ import annotations

from alembic import context

from draftsync.monitors import sync_jobs  # noqa: F401  (its tables belong to the same schema)
from draftsync.monitors.tables import Base

connection = context.config.attributes.get("connection")
if context.is_offline_mode() or connection is None:
    raise RuntimeError(
        "the monitor store migrates online only, on a connection passed in config.attributes['connection'] "
        "(its second revision backfills rollups from the stored samples); open it with draftsync's Store(url)"
    )
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
