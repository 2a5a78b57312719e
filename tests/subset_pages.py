"""What the tests of the subsets' index migrations share: a small store of a group's, an
endpoint's and a queue address's messages, every page of them, and the indexes' SQL."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa

from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailureGroup
from controlroom.errors.read.filters import SORT_KEYS, FailedMessageFilter, Ordering
from controlroom.errors.read.lists import list_failed_messages
from tests.factories import at, attempt

Answers = dict[tuple[int, Ordering], tuple[int, list[str]]]


def write_subsets(engine: sa.Engine, group: FailureGroup) -> None:
    """Twelve messages: two in three of endpoint and queue "queue" (the others "Other"),
    three in four in ``group``, one in five of no message type; two of them Resolved."""
    writer = FailedMessageBatchWriter(engine, clock=lambda: datetime(2026, 1, 2, tzinfo=UTC))
    writer.write(
        IngestionBatch(
            attempts=[
                dataclasses.replace(
                    attempt(n, at(10 * n), endpoint="queue" if n % 3 else "Other"),
                    groups=(group,) if n % 4 else (),
                    message_type=f"Type{n % 3}" if n % 5 else None,
                )
                for n in range(12)
            ]
        )
    )
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE failed_messages SET status = :s WHERE message_id IN ('msg-1', 'msg-6')"
            ),
            {"s": int(FailedMessageStatus.RESOLVED)},
        )


def every_subset(group: FailureGroup) -> tuple[FailedMessageFilter, ...]:
    """The subsets of ``write_subsets``' store: ``group`` and endpoint "queue", each with
    and without a status, and queue address "QUEUE" (in another case than stored)."""
    unresolved = frozenset({FailedMessageStatus.UNRESOLVED})
    return (
        FailedMessageFilter(group_id=group.id),
        FailedMessageFilter(group_id=group.id, statuses=unresolved),
        FailedMessageFilter(receiving_endpoint="queue"),
        FailedMessageFilter(receiving_endpoint="queue", statuses=unresolved),
        FailedMessageFilter(queue_address="QUEUE"),
    )


def answers(engine: sa.Engine, subsets: Sequence[FailedMessageFilter]) -> Answers:
    """The total and the ids of every page of 4 of each of ``subsets`` (by position), in
    every sort and direction."""
    found = {}
    with engine.connect() as conn:
        for n, where in enumerate(subsets):
            for key in SORT_KEYS:
                for descending in (True, False):
                    order = Ordering(key, descending)
                    ids: list[str] = []
                    total = 0
                    for offset in range(0, 12, 4):
                        page = list_failed_messages(
                            conn, offset=offset, limit=4, order=order, where=where
                        )
                        ids += [item.id for item in page.items]
                        total = page.total
                    found[n, order] = (total, ids)
    return found


def indexes(engine: sa.Engine) -> dict[str, str]:
    """The indexes of the failed messages and their group rows, by name, with their
    definitions (PostgreSQL) or SQL (SQLite)."""
    if engine.dialect.name == "postgresql":
        query = (
            "SELECT indexname, indexdef FROM pg_indexes "
            "WHERE tablename IN ('failed_messages', 'failed_message_groups')"
        )
    else:
        query = (
            "SELECT name, coalesce(sql, '') FROM sqlite_master WHERE type = 'index' "
            "AND tbl_name IN ('failed_messages', 'failed_message_groups')"
        )
    with engine.connect() as conn:
        return {str(name): str(sql) for name, sql in conn.exec_driver_sql(query).all()}
