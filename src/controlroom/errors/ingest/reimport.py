"""Re-import failed imports: put each one back on the error queue to be ingested again.

Source: docs/design.md "Failed imports" (a message kept whole in ``failed_error_imports`` can
be re-imported once the cause is fixed; nothing is ever dropped).

Ordering: the row is deleted in a transaction that commits only after the transport has
durably accepted the republished message. Holding the row (deleted but uncommitted)
while publishing also closes a race with a running ingestion: if the message fails
again at once, ingestion's insert-if-absent of the same failed-import id waits for this
transaction and then inserts it anew, instead of finding the old row, doing nothing, and
losing the message when the old row's delete commits. If the publish fails, the
transaction rolls back and the row stays. If the commit fails after the publish, the row
stays too and the message is queued as well: a duplicate, never a loss.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import sqlalchemy as sa

from controlroom.db.engine import begin_write
from controlroom.db.tables import failed_error_imports
from controlroom.errors import activity
from controlroom.runtime.wire_text import escape_wire_headers, escape_wire_text, is_wire_text_clean
from controlroom.transport import Transport, TransportError

fi = failed_error_imports.c
log = logging.getLogger(__name__)


class ReimportOutcome(enum.Enum):
    """What happened to one failed import."""

    REPUBLISHED = "republished"  # on the error queue; the row is gone
    GONE = "gone"  # no such row (already re-imported, or never there)
    # The stored headers are not a JSON object of UTF-8 strings (a header that was not
    # UTF-8 cannot be published unchanged); kept.
    UNREADABLE = "unreadable"
    FAILED = "failed"  # the publish or the store failed (logged); kept


def list_failed_import_ids(engine: sa.Engine) -> list[str]:
    """Ids of every failed import, oldest first."""
    with engine.connect() as conn:
        return list(conn.scalars(sa.select(fi.id).order_by(fi.failed_at, fi.id)))


@dataclass(frozen=True, slots=True)
class FailedImportSummary:
    """One failed import as operators see it, every text safe to show and serialize
    (bytes that were not UTF-8 escaped: ``runtime.wire_text``): ``failed_at`` is UTC,
    ``body_size`` bytes, ``headers`` the kept headers as an object, or their stored text
    when that is not a JSON object."""

    id: str
    queue: str
    reason: str
    failed_at: datetime
    headers: dict[str, str | None] | str
    body_size: int


@dataclass(frozen=True, slots=True)
class FailedImportPage:
    items: list[FailedImportSummary]
    total: int


def count_failed_imports(conn: sa.Connection) -> int:
    """How many messages are kept as failed imports."""
    return conn.execute(sa.select(sa.func.count()).select_from(failed_error_imports)).scalar_one()


def list_failed_imports(conn: sa.Connection, *, offset: int, limit: int) -> FailedImportPage:
    """Failed imports, newest first (``failed_at`` descending, then id), one page."""
    rows = conn.execute(
        sa.select(
            fi.id,
            fi.queue,
            fi.reason,
            fi.failed_at,
            fi.headers_json,
            sa.func.length(fi.body).label("body_size"),
        )
        .order_by(fi.failed_at.desc(), fi.id)
        .offset(offset)
        .limit(limit)
    ).all()
    return FailedImportPage(
        items=[
            FailedImportSummary(
                id=escape_wire_text(row.id),
                queue=escape_wire_text(row.queue),
                reason=escape_wire_text(row.reason),
                failed_at=row.failed_at,
                headers=shown_headers(row.headers_json),
                body_size=row.body_size,
            )
            for row in rows
        ],
        total=count_failed_imports(conn),
    )


def shown_headers(headers_json: str) -> dict[str, str | None] | str:
    """The stored headers to show: an object of escaped texts (values that are neither
    text nor null as their JSON), else the stored text itself, escaped."""
    try:
        value = json.loads(headers_json)
    except ValueError:
        return escape_wire_text(headers_json)
    if not isinstance(value, dict):
        return escape_wire_text(headers_json)
    return escape_wire_headers(
        {
            name: item if item is None or isinstance(item, str) else json.dumps(item)
            for name, item in value.items()
        }
    )


Publish = Callable[[str, dict[str, str | None], bytes], None]
"""``(queue, headers, body)``: publish and return once the transport confirmed it."""


def reimport_blocking(
    engine: sa.Engine, publish: Publish, failed_import_id: str, *, error_queue: str, by: str
) -> ReimportOutcome:
    """The re-import of one failed import, all in the calling thread (module docstring):
    the row is deleted, the re-import logged, the message published with ``publish``,
    then the transaction commits. Raises what ``publish`` or the store raises (the row
    stays)."""
    with begin_write(engine) as conn:
        # FOR UPDATE: a second re-importer of the same row waits, then finds it gone.
        row = conn.execute(
            sa.select(fi.headers_json, fi.body).where(fi.id == failed_import_id).with_for_update()
        ).one_or_none()
        if row is None:
            return ReimportOutcome.GONE
        headers = decode_headers(row.headers_json)
        if headers is None:
            return ReimportOutcome.UNREADABLE
        conn.execute(sa.delete(failed_error_imports).where(fi.id == failed_import_id))
        activity.failed_imports_reimported(
            conn, [failed_import_id], queue=error_queue, by=by, now=datetime.now(UTC)
        )
        publish(error_queue, headers, bytes(row.body))
    return ReimportOutcome.REPUBLISHED


async def reimport_failed_import(
    engine: sa.Engine,
    transport: Transport,
    failed_import_id: str,
    *,
    error_queue: str,
    by: str = "controlroom import-failed",
) -> ReimportOutcome:
    """Republish the headers and exact body of failed import ``failed_import_id`` to
    ``error_queue``, deleting its row only once the publish is confirmed (module docstring).

    The database work runs in a worker thread (the API calls this too); the publish runs
    on the caller's event loop, where the transport lives. ``by`` names who asked, in the
    event log. Raises ``TransportError`` when the publish may have failed (the row
    stays), the store's error when the database fails (the row stays; the message may be
    queued as well).
    """
    loop = asyncio.get_running_loop()

    def publish(queue: str, headers: dict[str, str | None], body: bytes) -> None:
        asyncio.run_coroutine_threadsafe(transport.publish(queue, headers, body), loop).result()

    return await asyncio.to_thread(
        reimport_blocking, engine, publish, failed_import_id, error_queue=error_queue, by=by
    )


@dataclass(slots=True)
class ReimportReport:
    """What a bulk re-import did: one outcome per id asked, in order, and for each id
    not re-imported (``UNREADABLE``, ``FAILED``) why, as text safe to show."""

    outcomes: list[ReimportOutcome] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)

    def count(self, outcome: ReimportOutcome) -> int:
        """How many ids came to ``outcome``."""
        return self.outcomes.count(outcome)


UNREADABLE_REASON = (
    "its headers are not a JSON object of UTF-8 texts, so it cannot go back on a queue unchanged"
)


async def reimport_many(
    engine: sa.Engine,
    transport: Transport,
    ids: Sequence[str],
    *,
    error_queue: str,
    by: str,
    on_each: Callable[[str, ReimportOutcome], None] | None = None,
) -> ReimportReport:
    """Re-import each of ``ids`` in turn (``reimport_failed_import``); one that cannot go
    back or whose publish or write fails is reported (``ReimportReport.kept``, the log)
    and kept, and the rest proceed. ``on_each(id, outcome)`` is called after each. Never
    raises for one id's failure (docs/design.md "Failed imports": nothing is dropped, and
    one message never holds up the others)."""
    report = ReimportReport()
    for failed_import_id in ids:
        try:
            outcome = await reimport_failed_import(
                engine, transport, failed_import_id, error_queue=error_queue, by=by
            )
        except Exception as exc:  # reported and kept; the others still go back
            log.warning(
                "failed import %s not re-imported: %s: %s",
                failed_import_id,
                type(exc).__name__,
                exc,
                exc_info=not isinstance(exc, TransportError | sa.exc.SQLAlchemyError),
            )
            outcome = ReimportOutcome.FAILED
            report.kept.append((failed_import_id, escape_wire_text(f"{type(exc).__name__}: {exc}")))
        else:
            if outcome is ReimportOutcome.UNREADABLE:
                report.kept.append((failed_import_id, UNREADABLE_REASON))
        report.outcomes.append(outcome)
        if on_each is not None:
            on_each(failed_import_id, outcome)
    return report


def decode_headers(headers_json: str) -> dict[str, str | None] | None:
    """The headers stored as JSON, or ``None`` unless they are an object whose values are
    all strings or null and whose names and values are all UTF-8 text: only such headers
    can go back on a queue unchanged (a transport publishes UTF-8 alone)."""
    try:
        value = json.loads(headers_json)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    if not all(item is None or isinstance(item, str) for item in value.values()):
        return None
    texts = [*value, *(item for item in value.values() if item is not None)]
    if not all(is_wire_text_clean(text) for text in texts):
        return None
    return value
