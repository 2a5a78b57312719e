"""Migration 0014 on a database of the previous schema, per provider: the group counts
are filled from the group rows stored before it, the groups views show what they showed
before, and a downgrade gives the previous schema back."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from alembic import command

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_group_counts,
    failed_message_groups,
)
from controlroom.db.transactions import begin_write
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.read import groups, operations
from tests.factories import at, attempt, message_uuid

fmg = failed_message_groups.c
counts = failed_message_group_counts.c
NOW = datetime(2026, 1, 2, tzinfo=UTC)


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    """A store at head holding four failed messages of one group, the second archived."""
    engine = create_store_engine(database_url)
    upgrade_database(engine)
    writer = FailedMessageBatchWriter(engine, clock=lambda: NOW)
    shared = attempt(0, at(0)).groups
    writer.write(IngestionBatch(attempts=[attempt(n, at(10 * n), groups=shared) for n in range(4)]))
    with begin_write(engine) as conn:
        operations.archive_messages(conn, [message_uuid(1)], NOW)
    try:
        yield engine
    finally:
        engine.dispose()


def views(engine: sa.Engine) -> list[list[tuple[object, ...]]]:
    with engine.connect() as conn:
        return [
            [
                (g.id, g.title, g.count, g.first, g.last)
                for g in groups.list_groups(conn, "Test", status=status)
            ]
            for status in (FailedMessageStatus.UNRESOLVED, FailedMessageStatus.ARCHIVED)
        ]


def stored_counts(engine: sa.Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        total = sa.func.sum(counts.n)
        rows = conn.execute(
            sa.select(counts.group_id, counts.status, total)
            .group_by(counts.group_id, counts.status)
            .having(total != 0)
            .order_by(counts.group_id, counts.status)
        ).all()
    return [(group_id, status, int(n)) for group_id, status, n in rows]


def test_counts_are_filled_from_the_group_rows_and_a_downgrade_drops_them(
    engine: sa.Engine,
) -> None:
    before = views(engine)
    group, title = attempt(0, at(0)).groups[0].id, attempt(0, at(0)).groups[0].title
    assert before == [
        [(group, title, 3, at(0), at(30))],
        [(group, title, 1, at(10), at(10))],
    ]
    command.downgrade(alembic_config(engine), "0011")
    assert "failed_message_group_counts" not in sa.inspect(engine).get_table_names()
    with engine.connect() as conn:  # 0011's index is back
        indexes = {i["name"] for i in sa.inspect(conn).get_indexes("failed_message_groups")}
    assert "ix_failed_message_groups_group_id_status" in indexes
    with begin_write(engine) as conn:  # a change made under 0011 is counted by the fill
        operations.archive_messages(conn, [message_uuid(3)], NOW)
    upgrade_database(engine)
    assert stored_counts(engine) == [
        (group, int(FailedMessageStatus.UNRESOLVED), 2),
        (group, int(FailedMessageStatus.ARCHIVED), 2),
    ]
    assert views(engine) == [
        [(group, title, 2, at(0), at(20))],
        [(group, title, 2, at(10), at(30))],
    ]
