"""Migration 0027 on each provider: the message id's own index gives way to one after the
status, a list of every status by message id and a lookup by message id read the same
answers through it, and a downgrade gives the old index back."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.read.filters import FailedMessageFilter, Ordering
from controlroom.errors.read.lists import list_failed_messages
from controlroom.errors.read.messages import find_stored_body
from controlroom.errors.read.search import search_failed_messages
from tests.factories import at, attempt, message_uuid
from tests.integration.test_migration_0025 import index_names

NEW = "ix_failed_messages_status_message_id_id"
OLD = "ix_failed_messages_message_id"
RESOLVED = FailedMessageFilter(statuses=frozenset({FailedMessageStatus.RESOLVED}))


def answers(engine: sa.Engine) -> tuple[object, ...]:
    """Every page of 4 by message id in both directions, of every status and of the
    resolved; a body and a search found by a message id."""
    found: list[object] = []
    with engine.connect() as conn:
        for where in (FailedMessageFilter(), RESOLVED):
            for descending in (True, False):
                order = Ordering("message_id", descending)
                found.append(
                    [
                        item.id
                        for offset in range(0, 12, 4)
                        for item in list_failed_messages(
                            conn, offset=offset, limit=4, order=order, where=where
                        ).items
                    ]
                )
        found.append(find_stored_body(conn, "msg-1"))
        hits = search_failed_messages(conn, "msg-3", offset=0, limit=5)
        found.append([item.summary.id for item in hits.items])
    return tuple(found)


def test_0027_replaces_the_message_id_index_and_gives_it_back(engine: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(engine, clock=lambda: datetime(2026, 1, 2, tzinfo=UTC))
    writer.write(
        IngestionBatch(
            attempts=[
                dataclasses.replace(attempt(n, at(10 * n)), message_id=f"msg-{n % 5}")
                for n in range(10)
            ]
        )
    )
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE failed_messages SET status = :s WHERE message_id = 'msg-1'"),
            {"s": int(FailedMessageStatus.RESOLVED)},
        )
    at_head = answers(engine)
    every, _, resolved, _, body, hits = at_head
    assert isinstance(every, list) and len(every) == 10 and len(set(every)) == 10
    assert isinstance(resolved, list) and len(resolved) == 2
    assert body is not None
    # Message id msg-3 is that of messages 3 and 8 (each failed in its own endpoint).
    assert isinstance(hits, list) and {message_uuid(3), message_uuid(8)} <= set(hits)
    names = index_names(engine)
    assert NEW in names and OLD not in names

    command.downgrade(alembic_config(engine), "0026")
    names = index_names(engine)
    assert OLD in names and NEW not in names
    assert answers(engine) == at_head
    upgrade_database(engine)
    assert answers(engine) == at_head
