"""Alembic environment: runs against the engine handed over in ``config.attributes``."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from controlroom.db.engine import begin_write, create_store_engine
from controlroom.db.leases import advisory_lock_key
from controlroom.db.tables import metadata

config = context.config
engine = config.attributes.get("engine") or create_store_engine(
    config.get_main_option("sqlalchemy.url") or ""
)

with begin_write(engine) as connection:
    if connection.dialect.name == "postgresql":
        # Processes starting together against a fresh database migrate one after the
        # other; the lock ends with this transaction.
        connection.execute(
            sa.select(sa.func.pg_advisory_xact_lock(advisory_lock_key("controlroom-migrations")))
        )
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    context.run_migrations()
