"""Compile-only checks of each provider's upsert SQL (the live tests are integration/)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from controlroom.db.providers import EMBEDDED, PROVIDER_MODULES, provider_for, provider_named
from controlroom.db.providers._base import MAX_ROWS_PER_STATEMENT
from controlroom.errors.ingest.upsert import upsert_statement
from controlroom.exceptions import UnsupportedProviderError


@pytest.mark.parametrize("dialect", [postgresql.dialect(), sqlite.dialect()])
def test_upsert_is_one_on_conflict_statement_whose_guards_read_the_stored_row(
    dialect: sa.Dialect,
) -> None:
    write = provider_for(dialect)
    sql = str(upsert_statement(write).compile(dialect=dialect))
    update = sql.split("ON CONFLICT (id) DO UPDATE SET", 1)[1]
    where = update.rsplit(" WHERE ", 1)[1]

    assert "excluded.last_failure_at != failed_messages.last_failure_at" in where
    assert "excluded.counted_failure_times" in where  # only uncounted attempts update
    assert "failed_messages.counted_failure_times" in where
    assert "excluded.last_failure_at >= failed_messages.last_failure_at" in update
    assert "FROM failed_messages" not in sql  # every subquery reads the conflicting row
    assert write.max_rows_per_statement == MAX_ROWS_PER_STATEMENT == 50


def test_unknown_provider_is_refused() -> None:
    with pytest.raises(UnsupportedProviderError):
        provider_for(sa.create_mock_engine("mssql+pyodbc://", executor=None).dialect)


def test_each_registered_module_holds_the_provider_of_its_backend_name() -> None:
    for name in PROVIDER_MODULES:
        assert provider_named(name).name == name
    assert provider_named("sqlite") is EMBEDDED
