"""Compile-only checks of each provider's upsert SQL (the live tests are integration/)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from controlroom.db.providers import provider_for
from controlroom.db.providers._base import MAX_ROWS_PER_STATEMENT
from controlroom.db.tables import failed_messages
from controlroom.errors.ingest.upsert import conditional_upsert_assignments
from controlroom.exceptions import UnsupportedProviderError


@pytest.mark.parametrize("dialect", [postgresql.dialect(), sqlite.dialect()])
def test_upsert_is_one_on_conflict_statement_whose_guards_read_the_stored_row(
    dialect: sa.Dialect,
) -> None:
    write = provider_for(dialect)
    statement = write.insert(failed_messages).values([{"id": "a"}, {"id": "b"}])
    statement = statement.on_conflict_do_update(
        index_elements=[failed_messages.c.id],
        set_=conditional_upsert_assignments(statement.excluded),
    )
    sql = str(statement.compile(dialect=dialect))

    assert "ON CONFLICT (id) DO UPDATE SET" in sql
    assert "excluded.last_failure_at != failed_messages.last_failure_at" in sql
    assert "excluded.last_failure_at >= failed_messages.last_failure_at" in sql
    assert write.max_rows_per_statement == MAX_ROWS_PER_STATEMENT == 50


def test_unknown_provider_is_refused() -> None:
    with pytest.raises(UnsupportedProviderError):
        provider_for(sa.create_mock_engine("mssql+pyodbc://", executor=None).dialect)
