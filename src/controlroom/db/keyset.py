"""Keyset pages, newest first, shared by the site-call half's lists (site calls, the audit
log, rejected telemetry) and the notification outbox's list.

Source: docs/decisions.md "Site-call lists page by keyset". A page ends with a cursor
naming its last row's sort key (an instant, its ticks of 100 ns where a site sent them,
then a text key that breaks ties); the next
page is the rows strictly after it in the same order, so rows sharing one instant are
neither repeated nor skipped. The cursor is opaque to clients (URL-safe base64 of JSON)
and only ever read back into bound parameters.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import KeyedColumnElement

from controlroom.exceptions import ControlroomError
from controlroom.telemetry.stamps import as_utc


class BadCursor(ControlroomError):
    """A paging cursor this service did not hand out."""


@dataclass(frozen=True, slots=True)
class Page:
    """Rows of one page, and the cursor of the next (``None`` on the last page)."""

    rows: Sequence[sa.Row[*tuple[Any, ...]]]
    next_cursor: str | None


Order = Sequence[KeyedColumnElement[Any]]
"""A list's sort key, most significant first: an instant, a stamp's ticks below it where
the stamp is kept to 100 ns (``telemetry.stamps``), then a text key that breaks ties."""


def encode_cursor(values: Sequence[datetime | int | str]) -> str:
    text = json.dumps([v.isoformat() if isinstance(v, datetime) else v for v in values])
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, order: Order) -> list[datetime | int | str]:
    """The values of ``order``'s columns in ``cursor``, each of its column's kind (an
    instant in UTC, an integer, a text). Raises ``BadCursor``."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        given = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if not isinstance(given, list) or len(given) != len(order):
            raise ValueError
        return [_cursor_value(value, column) for value, column in zip(given, order, strict=True)]
    except (ValueError, TypeError, UnicodeDecodeError):  # binascii.Error is a ValueError
        raise BadCursor("the cursor is not one this service handed out") from None


def _cursor_value(value: object, column: KeyedColumnElement[Any]) -> datetime | int | str:
    kind = column.type.python_type
    if kind is datetime and isinstance(value, str):
        parsed = datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            raise ValueError
        return as_utc(parsed)  # a forged time past what the store holds is refused
    if kind is int and type(value) is int and -(2**15) <= value < 2**15:  # ticks: smallint
        return value
    if kind is str and isinstance(value, str):
        return value
    raise ValueError


def keyset_page(
    conn: sa.Connection,
    query: sa.Select[Any],
    order: Order,
    conditions: Sequence[sa.ColumnElement[bool]],
    *,
    limit: int,
    after: str | None,
) -> Page:
    """``limit`` rows of ``query`` (which selects every column of ``order`` among its
    own) matching ``conditions``, the greatest ``order`` first, strictly after the cursor
    ``after``. Raises ``BadCursor``."""
    where = list(conditions)
    if after is not None:
        last = decode_cursor(after, order)
        bound = [sa.literal(value, column.type) for value, column in zip(last, order, strict=True)]
        where.append(sa.tuple_(*order) < sa.tuple_(*bound))
    rows = conn.execute(
        query.where(*where).order_by(*(column.desc() for column in order)).limit(limit + 1)
    ).all()
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = None
    if more and rows:
        cursor = encode_cursor([getattr(rows[-1], column.key) for column in order])
    return Page(rows, cursor)
