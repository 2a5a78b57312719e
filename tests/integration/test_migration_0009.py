"""Migration 0009 on a database of the previous schema, per provider: every row stays
findable by the same searches once the backfill has written its terms, and its attempts
keep counting by the seed's rule for what the row cannot tell."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import failed_messages
from controlroom.errors.ingest.fold import fold_attempts
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.search_backfill import (
    count_rows_without_search_terms,
    write_missing_search_terms,
)
from controlroom.errors.ingest.writer import (
    FailedMessageBatchWriter,
    IngestionBatch,
    failed_message_row,
)
from controlroom.errors.model import FailedAttempt
from controlroom.errors.read.search import search_failed_messages
from tests.factories import at
from tests.nsb import failed_headers

SEARCHES = (
    "zanzibar",
    "blueberry",
    "Shop.Sales.OrderRejectedException",
    "OrderRejectedException",
    "InvalidOperationException",
    "m-plain-0",
    "walrus",
)


def failure(message_id: str, body: bytes = b"{}", **headers: str) -> FailedAttempt:
    values = failed_headers(message_id, failed_at=at(10)) | headers
    return parse_failed_message(values, body, max_body_size_to_store=102_400)


def previous_schema_rows(attempts: list[FailedAttempt]) -> list[dict]:
    """The rows the previous write path stored (no counted times, no terms)."""
    now = datetime(2026, 1, 2, tzinfo=UTC)
    rows = [failed_message_row(message, now) for message in fold_attempts(attempts)]
    for row in rows:
        del row["counted_failure_times"], row["search_vector"]
    return rows


@pytest.fixture
def previous_engine(database_url: str) -> Iterator[sa.Engine]:
    """A store migrated up to 0004 only, with failed messages written in its schema."""
    engine = create_store_engine(database_url)
    upgrade_database(engine, "0004")
    try:
        yield engine
    finally:
        engine.dispose()


def found(engine: sa.Engine, text: str) -> set[str]:
    with engine.connect() as conn:
        return {
            hit.summary.id for hit in search_failed_messages(conn, text, offset=0, limit=500).items
        }


def test_every_row_stays_findable_by_the_same_searches(previous_engine: sa.Engine) -> None:
    attempts = [
        failure("m-body", b'{"Note":"zanzibar delivery"}'),
        failure("m-header", **{"Shop.Tenant": "blueberry"}),
        failure(
            "m-dotnet",
            **{"NServiceBus.ExceptionInfo.ExceptionType": "Shop.Sales.OrderRejectedException"},
        ),
        *[failure(f"m-plain-{n}", **{"Batch": "walrus"}) for n in range(25)],
    ]
    rows = previous_schema_rows(attempts)
    columns = [sa.column(name, failed_messages.c[name].type) for name in rows[0]]
    with previous_engine.begin() as conn:
        conn.execute(sa.insert(sa.table("failed_messages", *columns)), rows)
    before = {text: found(previous_engine, text) for text in SEARCHES}
    assert all(before.values())

    upgrade_database(previous_engine)
    assert count_rows_without_search_terms(previous_engine) == len(rows)
    progress: list[tuple[int, int]] = []
    written = write_missing_search_terms(
        previous_engine, batch_rows=10, progress=lambda done, total: progress.append((done, total))
    )

    assert written == len(rows)
    assert progress == [(10, 28), (20, 28), (28, 28)]
    assert count_rows_without_search_terms(previous_engine) == 0
    assert {text: found(previous_engine, text) for text in SEARCHES} == before
    assert write_missing_search_terms(previous_engine) == 0
    if previous_engine.dialect.name == "sqlite":  # the FTS5 index matches its content
        with previous_engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO failed_messages_fts(failed_messages_fts) VALUES ('integrity-check')"
            )


def test_a_row_of_the_previous_schema_counts_by_the_seed_rule(previous_engine: sa.Engine) -> None:
    [row] = previous_schema_rows([failure("m-old")])
    columns = [sa.column(name, failed_messages.c[name].type) for name in row]
    with previous_engine.begin() as conn:
        conn.execute(sa.insert(sa.table("failed_messages", *columns)), [row])
    upgrade_database(previous_engine)
    writer = FailedMessageBatchWriter(previous_engine)

    writer.write(IngestionBatch(attempts=[failure("m-old")]))  # its stored attempt again
    writer.write(IngestionBatch(attempts=[failure("m-old") for _ in range(1)]))
    with previous_engine.connect() as conn:
        count = conn.execute(sa.select(failed_messages.c.number_of_processing_attempts)).scalar()
    assert count == 1

    newer = parse_failed_message(
        failed_headers("m-old", failed_at=at(20)), b"{}", max_body_size_to_store=100
    )
    writer.write(IngestionBatch(attempts=[newer]))
    writer.write(IngestionBatch(attempts=[newer]))
    with previous_engine.connect() as conn:
        stored = conn.execute(sa.select(failed_messages)).one()
    assert stored.number_of_processing_attempts == 2
    assert stored.search_vector  # the new attempt wrote its terms
