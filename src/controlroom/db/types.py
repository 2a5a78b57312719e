"""Column types shared by every provider."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, TSVECTOR


class UtcDateTime(sa.types.TypeDecorator[datetime]):
    """A UTC instant: stored naive (in UTC), returned timezone-aware (UTC).

    Naive storage keeps SQLite's text form sortable and comparable inside SQL guards
    (``YYYY-MM-DD HH:MM:SS.ffffff``); aware values are converted to UTC on the way in.
    Raises ``ValueError`` for a naive ``datetime``: an instant must say its zone.
    """

    impl = sa.DateTime
    cache_ok = True

    @property
    def python_type(self) -> type[datetime]:
        return datetime

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("UtcDateTime needs a timezone-aware datetime")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC)


class SearchTermsText(sa.types.TypeDecorator[Any]):
    """A message's search terms as the text an FTS5 index reads: the terms, space
    separated (no term holds white space). Binds a sequence of terms; reads the text."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Sequence[str] | None, dialect: sa.Dialect) -> str | None:
        return None if value is None else " ".join(value)


class SearchTermsVector(sa.types.TypeDecorator[Any]):
    """A message's search terms as a PostgreSQL ``tsvector`` built from them as they are
    (``array_to_tsvector``: each term one lexeme, no parser, no stemming). Binds a
    sequence of terms; reads the ``tsvector``'s text.

    The terms travel as one text, space separated (no term holds white space), which the
    server splits (``string_to_array``, no text-search parser): psycopg dumps a list of
    some hundred strings as an array in Python, at about 0.15 ms of client CPU a row
    (``benchmarks/ingest.py``), one text at next to nothing."""

    impl = TSVECTOR
    cache_ok = True

    def bind_expression(self, bindvalue: Any) -> Any:
        return sa.func.array_to_tsvector(
            sa.func.string_to_array(sa.cast(bindvalue, sa.Text), " ", type_=ARRAY(sa.Text))
        )

    def process_bind_param(self, value: Sequence[str] | None, dialect: sa.Dialect) -> Any:
        return None if value is None else " ".join(value)
