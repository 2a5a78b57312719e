"""The store reads its server's memory and WAL settings as the server states them, and
the size of the indexes every write adds to (docs/decisions.md "The write path's cost
does not grow with the store"); SQLite has none of these settings and warns of nothing."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from controlroom.db.providers import provider_for
from controlroom.db.providers._postgresql_settings import (
    read_server_settings,
    settings_warnings,
)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_the_settings_are_read_in_bytes_and_seconds_as_the_server_states_them(
    engine: sa.Engine,
) -> None:
    with engine.connect() as conn:
        settings = read_server_settings(conn)
        shared_buffers, max_wal_size, index_bytes = conn.execute(
            sa.text(
                "SELECT pg_size_bytes(current_setting('shared_buffers')), "
                "pg_size_bytes(current_setting('max_wal_size')), "
                "pg_indexes_size('failed_messages') + pg_indexes_size('failed_message_groups')"
            )
        ).one()
        timeout = conn.exec_driver_sql(
            "SELECT extract(epoch FROM CAST(current_setting('checkpoint_timeout') AS interval))"
        ).scalar_one()
        huge_pages = conn.exec_driver_sql("SHOW huge_pages").scalar_one()

    assert settings.shared_buffers == shared_buffers
    assert settings.max_wal_size == max_wal_size
    assert settings.checkpoint_timeout == int(timeout)
    assert settings.index_bytes == index_bytes > 0
    assert settings.huge_pages == huge_pages


def test_the_provider_warns_as_its_settings_call_for(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        warnings = provider_for(conn).server_settings_warnings(conn)
        if engine.dialect.name == "postgresql":
            assert warnings == settings_warnings(read_server_settings(conn))
        else:
            assert warnings == []
