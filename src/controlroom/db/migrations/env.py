"""Alembic environment: runs against the engine handed over in ``config.attributes``."""

from __future__ import annotations

from alembic import context

from controlroom.db.engine import begin_write, create_store_engine
from controlroom.db.providers import provider_for
from controlroom.db.tables import metadata

config = context.config
engine = config.attributes.get("engine") or create_store_engine(
    config.get_main_option("sqlalchemy.url") or ""
)
provider = provider_for(engine)

with begin_write(engine) as connection:
    provider.migration_lock(connection)
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=provider.alters_tables_in_batch,
    )
    context.run_migrations()
