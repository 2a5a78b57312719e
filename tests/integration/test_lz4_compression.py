"""Migration 0026: on a PostgreSQL server with lz4, the failed messages' large columns are
compressed by lz4, and a downgrade returns them to the server's default
(docs/decisions.md "The failed messages' large columns are compressed by lz4")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import alembic_config, upgrade_database

COLUMNS = {"headers_json", "body_text", "search_vector"}


@pytest.fixture
def store(postgresql_url: str) -> Iterator[sa.Engine]:
    engine = create_store_engine(postgresql_url)
    try:
        upgrade_database(engine)
        yield engine
    finally:
        engine.dispose()


def compression(engine: sa.Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT attname, attcompression FROM pg_attribute "
                "WHERE attrelid = 'failed_messages'::regclass AND attname = ANY(:columns)"
            ),
            {"columns": sorted(COLUMNS)},
        ).all()
    return {name: str(method) for name, method in rows}


def test_the_large_columns_are_lz4_and_a_downgrade_returns_them_to_the_default(
    store: sa.Engine,
) -> None:
    with store.connect() as conn:
        available = conn.execute(
            sa.text("SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'")
        ).scalar()
    if available is None or "lz4" not in available:
        pytest.skip("this PostgreSQL server has no lz4")
    assert compression(store) == dict.fromkeys(COLUMNS, "l")

    command.downgrade(alembic_config(store), "0025")
    assert set(compression(store).values()) <= {"", "\x00"}

    upgrade_database(store)
    assert compression(store) == dict.fromkeys(COLUMNS, "l")
