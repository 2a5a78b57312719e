"""Apply the Alembic migrations that ship inside the package."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(engine: sa.Engine) -> Config:
    """An Alembic configuration bound to ``engine`` (no alembic.ini needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["engine"] = engine
    return config


def upgrade_database(engine: sa.Engine, revision: str = "head") -> None:
    """Bring the schema of ``engine``'s database up to ``revision`` (idempotent)."""
    command.upgrade(alembic_config(engine), revision)
