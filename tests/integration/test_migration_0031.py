"""Migration 0031 on each provider: on PostgreSQL the indexes a subset is read by include
its fenced sorts' keys, every page of a group, an endpoint and a queue address reads the
same answers through them, and a downgrade takes them back; SQLite's indexes are left as
they were."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailureGroup
from controlroom.errors.read.filters import SORT_KEYS, FailedMessageFilter, Ordering
from controlroom.errors.read.lists import list_failed_messages
from tests.factories import at, attempt

GROUP = FailureGroup(id=str(uuid.uuid5(uuid.NAMESPACE_URL, "0031")), classifier="T", title="t")
INCLUDED = {
    "ix_failed_message_groups_group_id_status_first": "INCLUDE (last_modified)",
    "ix_failed_messages_receiving_endpoint_time_sent": ("INCLUDE (last_modified, status)"),
    "ix_failed_messages_queue_address_lower_time_sent": (
        "INCLUDE (queue_address, last_modified, status)"
    ),
}
BEFORE = {"ix_failed_messages_queue_address_lower_time_sent": "INCLUDE (queue_address)"}
SUBSETS = (
    FailedMessageFilter(group_id=GROUP.id),
    FailedMessageFilter(group_id=GROUP.id, statuses=frozenset({FailedMessageStatus.UNRESOLVED})),
    FailedMessageFilter(receiving_endpoint="queue"),
    FailedMessageFilter(
        receiving_endpoint="queue", statuses=frozenset({FailedMessageStatus.UNRESOLVED})
    ),
    FailedMessageFilter(queue_address="QUEUE"),
)


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


def included(engine: sa.Engine) -> dict[str, str]:
    """The ``INCLUDE`` clause of each index of ``INCLUDED`` (empty: none)."""
    found = indexes(engine)
    return {
        name: found[name].partition("INCLUDE")[1] + found[name].partition("INCLUDE")[2]
        for name in INCLUDED
    }


def answers(engine: sa.Engine) -> dict[tuple[int, Ordering], tuple[int, list[str]]]:
    """The total and the ids of every page of 4 of each subset, in every sort and
    direction."""
    found = {}
    with engine.connect() as conn:
        for n, where in enumerate(SUBSETS):
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


def test_0031_includes_the_fenced_sorts_keys_in_the_subsets_indexes(engine: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(engine, clock=lambda: datetime(2026, 1, 2, tzinfo=UTC))
    writer.write(
        IngestionBatch(
            attempts=[
                dataclasses.replace(
                    attempt(n, at(10 * n), endpoint="queue" if n % 3 else "Other"),
                    groups=(GROUP,) if n % 4 else (),
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
    at_head = answers(engine)
    assert all(ids for _, ids in at_head.values())
    postgresql = engine.dialect.name == "postgresql"
    if postgresql:
        assert included(engine) == INCLUDED
    else:
        assert not any("INCLUDE" in sql for sql in indexes(engine).values())

    command.downgrade(alembic_config(engine), "0030")
    if postgresql:
        assert included(engine) == {name: BEFORE.get(name, "") for name in INCLUDED}
    assert answers(engine) == at_head
    upgrade_database(engine)
    assert answers(engine) == at_head
    if postgresql:
        assert included(engine) == INCLUDED
