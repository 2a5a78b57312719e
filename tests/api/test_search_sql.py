"""The per-provider full-text SQL without a server: the FTS5 query built from user text,
the compiled PostgreSQL condition, and the provider registry."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from controlroom.db.providers import provider_for
from controlroom.db.providers.sqlite import fts_query
from controlroom.exceptions import UnsupportedProviderError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("InvalidOperationException", '"InvalidOperationException"'),
        ("System.InvalidOperationException", '"System.InvalidOperationException"'),
        ("  two   words ", '"two" "words"'),
        ('say "hi"', '"say" """hi"""'),
        ("NEAR(a b)", '"NEAR(a" "b)"'),
        ("col:term -x *", '"col:term" "-x" "*"'),
        ("'; DROP TABLE failed_messages; --", '"\';" "DROP" "TABLE" "failed_messages;" "--"'),
        ("a\x00b", '"a" "b"'),
        ("", ""),
        (" \t\n", ""),
    ],
)
def test_fts_query_quotes_every_word_as_a_phrase(text: str, expected: str) -> None:
    assert fts_query(text) == expected


def compiled(dialect: sa.Dialect, text: str) -> sa.engine.Compiled:
    return (
        sa.select(sa.literal_column("1"))
        .where(provider_for(dialect).search_matches(text))
        .compile(dialect=dialect)
    )


def test_postgresql_condition_is_parameterized_tsquery_over_the_search_vector() -> None:
    query = compiled(postgresql.dialect(), "'; DROP TABLE failed_messages; --")
    sql = str(query)

    assert "failed_messages.search_vector @@ plainto_tsquery(" in sql
    assert "regexp_replace(" in sql and "phraseto_tsquery" not in sql  # no recheck
    assert "DROP" not in sql and "LIKE" not in sql.upper()
    assert "'; DROP TABLE failed_messages; --" in query.params.values()
    assert "simple" in query.params.values() and "[^[:alnum:]]+" in query.params.values()


def test_postgresql_condition_drops_nul_which_postgresql_text_cannot_hold() -> None:
    query = compiled(postgresql.dialect(), "a\x00b")

    assert "a b" in query.params.values()


def test_sqlite_condition_matches_the_fts_table_with_a_bound_query() -> None:
    query = compiled(sqlite.dialect(), 'x" OR y')
    sql = str(query)

    assert "failed_messages.rowid IN (SELECT failed_messages_fts.rowid" in sql
    assert "failed_messages_fts MATCH ?" in sql and "LIKE" not in sql.upper()
    assert list(query.params.values()) == ['"x""" "OR" "y"']


def test_sqlite_condition_of_no_words_matches_nothing_without_asking_fts5() -> None:
    sql = str(compiled(sqlite.dialect(), "   "))

    assert "MATCH" not in sql


def test_a_provider_without_full_text_search_is_refused() -> None:
    with pytest.raises(UnsupportedProviderError, match="mysql"):
        provider_for(mysql.dialect())
