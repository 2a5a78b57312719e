"""Migration 0034 on each provider: ``retry_operation_messages`` is created and filled with
the claims the operations' batches still hold (each with its operation), the outcome of an
operation from before it counts those, and a downgrade takes the table back."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from controlroom.config import Settings
from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import failed_message_retries, retry_batches, retry_operation_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.retries import outcomes
from controlroom.errors.retries import requests as retries
from tests.factories import at
from tests.nsb import failed_headers
from tests.retries.conftest import store_failed


def kept(engine: sa.Engine) -> set[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(retry_operation_messages)).all()
    return {(row.operation_id, row.failed_message_id) for row in rows}


def held_claims(engine: sa.Engine) -> set[tuple[str, str]]:
    claims = failed_message_retries.join(
        retry_batches, retry_batches.c.id == failed_message_retries.c.retry_batch_id
    )
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                retry_batches.c.request_id, failed_message_retries.c.failed_message_id
            ).select_from(claims)
        ).all()
    return {(row.request_id, row.failed_message_id) for row in rows}


def test_0034_keeps_the_ids_each_retry_operation_still_holds(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    ids = [
        store_failed(settings, writer, body_store, failed_headers(f"m-{n}")).unique_message_id
        for n in range(3)
    ]
    first = retries.retry_messages(engine, ids[:2]).operation_id
    second = retries.retry_message(engine, ids[2]).operation_id
    at_head = kept(engine)
    assert at_head == held_claims(engine) == {(first, ids[0]), (first, ids[1]), (second, ids[2])}

    command.downgrade(alembic_config(engine), "0033")
    assert "retry_operation_messages" not in sa.inspect(engine).get_table_names()
    upgrade_database(engine)
    assert kept(engine) == at_head

    # An operation from before counts a message it held that fails again afterwards.
    store_failed(settings, writer, body_store, failed_headers("m-1", failed_at=at(3600)))
    with engine.connect() as conn:
        operation = retries.get_operation(conn, first)
        assert operation is not None
        assert outcomes.failed_again_since(conn, operation) == 1
