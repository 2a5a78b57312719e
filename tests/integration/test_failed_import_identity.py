"""Failed-import identity (docs/decisions.md "Failed imports have an identity"), on every provider:
the same message failing to import twice is one row, keyed by message id and endpoint when the
message names them, else by its content; migration 0007 re-keys the rows an older version wrote."""

from __future__ import annotations

import json
import uuid

import sqlalchemy as sa

from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import failed_error_imports
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.identity import deterministic_id, failed_import_id
from controlroom.errors.ingest.pipeline import make_failed_import
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from tests.factories import at


def test_a_redelivery_with_changed_headers_is_the_same_import() -> None:
    first = make_failed_import(
        {h.MESSAGE_ID: "m-1", h.PROCESSING_ENDPOINT: "Sales", "X-Attempt": "1"},
        b"{}",
        queue="error",
        reason="no FailedQ",
    )
    again = make_failed_import(
        {h.MESSAGE_ID: "m-1", h.PROCESSING_ENDPOINT: "Sales", "X-Attempt": "2"},
        b"{ }",
        queue="error",
        reason="no FailedQ",
    )
    assert first.id == again.id == deterministic_id("m-1Sales")


def test_without_a_message_id_the_content_is_the_identity() -> None:
    one = make_failed_import({"X": "1"}, b"a", queue="error", reason="r")
    assert make_failed_import({"X": "1"}, b"a", queue="error", reason="r").id == one.id
    assert make_failed_import({"X": "1"}, b"b", queue="error", reason="r").id != one.id
    assert make_failed_import({"X": "2"}, b"a", queue="error", reason="r").id != one.id


def test_twice_through_the_writer_is_one_row(engine: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(engine)
    for attempt in ("1", "2"):
        headers = {h.MESSAGE_ID: "m-1", h.PROCESSING_ENDPOINT: "Sales", "X-Attempt": attempt}
        item = make_failed_import(headers, b"{}", queue="error", reason="no FailedQ")
        writer.write(IngestionBatch(failed_imports=[item]))
    with engine.connect() as conn:
        ids = conn.scalars(sa.select(failed_error_imports.c.id)).all()
    assert ids == [deterministic_id("m-1Sales")]


def test_migration_0007_rekeys_older_rows_keeping_the_latest(database_url: str) -> None:
    engine = sa.create_engine(database_url)
    try:
        upgrade_database(engine, "0004")
        rows = []
        for n, seconds in enumerate((10, 30, 20)):  # one message, three old content ids
            headers = {h.MESSAGE_ID: "m-1", h.FAILED_Q: "", "X-Attempt": str(n)}
            rows.append(_old_row(headers, f"reason {n}", seconds))
        rows.append(_old_row({"X": "no message id"}, "other", 5))
        with engine.begin() as conn:
            conn.execute(sa.insert(failed_error_imports), rows)

        upgrade_database(engine)

        with engine.connect() as conn:
            found = conn.execute(
                sa.select(failed_error_imports.c.id, failed_error_imports.c.reason).order_by(
                    failed_error_imports.c.reason
                )
            ).all()
        no_id = rows[-1]
        content_id = failed_import_id({"X": "no message id"}, str(no_id["headers_json"]), b"")
        assert [tuple(row) for row in found] == [
            (content_id, "other"),  # keyed by its content
            (deterministic_id("m-1"), "reason 1"),  # the latest failure of m-1
        ]
    finally:
        engine.dispose()


def _old_row(headers: dict[str, str], reason: str, seconds: float) -> dict[str, object]:
    headers_json = json.dumps(headers, sort_keys=True, ensure_ascii=True)
    return {
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, headers_json)),  # an older content id
        "queue": "error",
        "headers_json": headers_json,
        "body": b"",
        "reason": reason,
        "failed_at": at(seconds),
    }
