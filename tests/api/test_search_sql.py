"""The per-provider full-text SQL without a server: the FTS5 query built from the terms of
user text, the compiled PostgreSQL condition, and the provider registry."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from controlroom.db.providers import SearchQuery, SearchTerms, provider_for
from controlroom.db.providers.sqlite import fts_query
from controlroom.errors.ingest.search_terms import parse_search
from controlroom.exceptions import UnsupportedProviderError


@pytest.mark.parametrize(
    ("terms", "expected"),
    [
        (["invalidoperationexception"], '"invalidoperationexception"'),
        (["two", "words"], '"two" "words"'),
        (['say"hi'], '"say""hi"'),
        (["near(a", "col:term", "*"], '"near(a" "col:term" "*"'),
        ([], ""),
    ],
)
def test_fts_query_quotes_every_term(terms: list[str], expected: str) -> None:
    assert fts_query(SearchQuery((SearchTerms(words=tuple(terms)),))) == expected


def compiled(dialect: sa.Dialect, text: str) -> sa.engine.Compiled:
    return (
        sa.select(sa.literal_column("1"))
        .where(provider_for(dialect).search_matches(parse_search(text)))
        .compile(dialect=dialect)
    )


def test_postgresql_condition_is_a_tsquery_of_bound_terms_over_the_search_vector() -> None:
    query = compiled(postgresql.dialect(), "'; DROP TABLE failed_messages; --")
    sql = str(query)

    assert "failed_messages.search_vector @@ CAST(%(param_1)s::VARCHAR AS TSQUERY)" in sql
    assert "to_tsquery" not in sql and "phraseto_tsquery" not in sql  # no parser, no recheck
    assert "DROP" not in sql and "LIKE" not in sql.upper()
    assert list(query.params.values()) == ["('drop' & 'table' & 'failed' & 'messages')"]


def test_postgresql_query_of_many_words_is_one_flat_bound_string() -> None:
    query = compiled(postgresql.dialect(), " ".join(f"w{n}" for n in range(500)))

    assert list(query.params.values()) == [" & ".join(f"'w{n}'" for n in range(500)).join("()")]


def test_sqlite_condition_matches_the_fts_table_with_a_bound_query() -> None:
    query = compiled(sqlite.dialect(), 'x" OR y')
    sql = str(query)

    assert "failed_messages.rowid IN (SELECT failed_messages_fts.rowid" in sql
    assert "failed_messages_fts MATCH ?" in sql and "LIKE" not in sql.upper()
    assert list(query.params.values()) == ['"x" "or" "y"']


@pytest.mark.parametrize("dialect", [postgresql.dialect(), sqlite.dialect()])
def test_a_search_without_terms_matches_nothing_without_asking_the_index(
    dialect: sa.Dialect,
) -> None:
    sql = str(compiled(dialect, " -- !! "))

    assert "MATCH" not in sql and "@@" not in sql


def test_a_provider_without_full_text_search_is_refused() -> None:
    with pytest.raises(UnsupportedProviderError, match="mysql"):
        provider_for(mysql.dialect())
