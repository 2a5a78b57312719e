"""Keyset pages, newest first, shared by the site-call half's lists (site calls, the audit
log, rejected telemetry) and the notification outbox's list.

Source: docs/decisions.md "Site-call lists page by keyset". A page ends with a cursor
naming its last row's sort key (an instant, then a text key that breaks ties); the next
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


def encode_cursor(instant: datetime, key: str) -> str:
    text = json.dumps([instant.isoformat(), key])
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The ``(instant, key)`` in ``cursor``. Raises ``BadCursor``."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        instant, key = json.loads(base64.urlsafe_b64decode(padded.encode()))
        parsed = datetime.fromisoformat(instant)
        if parsed.tzinfo is None or not isinstance(key, str):
            raise ValueError
        return as_utc(parsed), key  # a forged time past what the store holds is refused
    except (ValueError, TypeError, UnicodeDecodeError):  # binascii.Error is a ValueError
        raise BadCursor("the cursor is not one this service handed out") from None


def keyset_page(
    conn: sa.Connection,
    query: sa.Select[Any],
    instant: KeyedColumnElement[Any],
    key: KeyedColumnElement[Any],
    conditions: Sequence[sa.ColumnElement[bool]],
    *,
    limit: int,
    after: str | None,
) -> Page:
    """``limit`` rows of ``query`` (which selects ``instant`` and ``key`` among its
    columns) matching ``conditions``, newest ``(instant, key)`` first, strictly after the
    cursor ``after``. Raises ``BadCursor``."""
    where = list(conditions)
    if after is not None:
        at, last_key = decode_cursor(after)
        where.append(sa.tuple_(instant, key) < sa.tuple_(sa.literal(at, instant.type), last_key))
    rows = conn.execute(
        query.where(*where).order_by(instant.desc(), key.desc()).limit(limit + 1)
    ).all()
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = None
    if more and rows:
        last = rows[-1]
        cursor = encode_cursor(getattr(last, instant.key), getattr(last, key.key))
    return Page(rows, cursor)
