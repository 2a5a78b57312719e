"""Search terms for failed messages stored before migration 0009 (they have none yet).

Migration 0009 leaves those rows' ``search_vector`` NULL rather than computing it inside
its one transaction, which would hold the table's lock for as long as a million rows
take. Here they get their terms (``search_terms.message_search_terms`` of the stored
headers and body text: what the writer would have computed) in batches of
``BATCH_ROWS``, one short write transaction each, found through the partial index
``ix_failed_messages_search_pending``. Safe beside running writers and a second
backfill: a row is only written while it still has no terms.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from controlroom.db.engine import begin_write
from controlroom.db.tables import failed_messages
from controlroom.errors.ingest.search_terms import message_search_terms

BATCH_ROWS = 1_000

Progress = Callable[[int, int], None]
"""Called after each batch with (rows done, rows pending when the backfill started)."""

_fm = failed_messages.c
_PENDING = _fm.search_vector.is_(None)


def count_rows_without_search_terms(engine: sa.Engine) -> int:
    """How many failed messages have no search terms yet (0 once the backfill is done)."""
    with engine.connect() as conn:
        count = sa.select(sa.func.count()).select_from(failed_messages).where(_PENDING)
        return int(conn.execute(count).scalar_one())


def write_missing_search_terms(
    engine: sa.Engine, *, batch_rows: int = BATCH_ROWS, progress: Progress | None = None
) -> int:
    """Give every failed message without search terms its terms; returns how many rows
    were written. Store errors propagate (what was committed stays: a rerun resumes)."""
    total = count_rows_without_search_terms(engine)
    done = 0
    after = ""
    while True:
        with begin_write(engine) as conn:
            rows = conn.execute(
                sa.select(_fm.id, _fm.headers_json, _fm.body_text)
                .where(_PENDING, _fm.id > after)
                .order_by(_fm.id)
                .limit(batch_rows)
            ).all()
            if not rows:
                return done
            conn.execute(
                sa.update(failed_messages)
                .where(_fm.id == sa.bindparam("row_id"), _PENDING)
                .values(search_vector=sa.bindparam("terms", type_=_fm.search_vector.type)),
                [
                    {
                        "row_id": row.id,
                        "terms": stored_search_terms(row.headers_json, row.body_text),
                    }
                    for row in rows
                ],
            )
        done += len(rows)
        after = rows[-1].id
        if progress is not None:
            progress(done, max(total, done))


def stored_search_terms(headers_json: str, body_text: str | None) -> list[str]:
    """The terms of a stored row: its headers are ``headers_json`` (an object of header
    name to value or null, as ``headers.headers_to_json`` wrote it)."""
    headers: Any = json.loads(headers_json)
    if not isinstance(headers, dict):
        headers = {}
    values = {
        str(name): value if isinstance(value, str) else None for name, value in headers.items()
    }
    return message_search_terms(values, body_text)
