"""Migration 0011 on a database of the previous schema, per provider: group rows stored
before it get their message's status and failure window, and the groups views show
what they showed before the migration."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from alembic import command

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import FailedMessageStatus, failed_message_groups, failed_messages
from controlroom.db.transactions import begin_write
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.read import groups
from tests.factories import at, attempt, message_uuid

fm = failed_messages.c
fmg = failed_message_groups.c


@pytest.fixture
def engine_at_0010(database_url: str) -> Iterator[sa.Engine]:
    """A store at 0010 holding three failed messages of one group, the second archived."""
    engine = create_store_engine(database_url)
    upgrade_database(engine)
    writer = FailedMessageBatchWriter(engine, clock=lambda: datetime(2026, 1, 2, tzinfo=UTC))
    shared = attempt(0, at(0)).groups
    writer.write(IngestionBatch(attempts=[attempt(n, at(10 * n), groups=shared) for n in range(3)]))
    with begin_write(engine) as conn:
        conn.execute(
            sa.update(failed_messages)
            .where(fm.id == message_uuid(1))
            .values(status=int(FailedMessageStatus.ARCHIVED))
        )
    command.downgrade(alembic_config(engine), "0010")
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


def test_group_rows_stored_before_get_their_messages_columns(engine_at_0010: sa.Engine) -> None:
    upgrade_database(engine_at_0010)
    with engine_at_0010.connect() as conn:
        rows = conn.execute(
            sa.select(
                fmg.status,
                fmg.first_failure_at,
                fmg.last_failure_at,
                fm.status,
                fm.first_failure_at,
            )
            .join_from(failed_message_groups, failed_messages, fm.id == fmg.failed_message_id)
            .order_by(fm.id)
        ).all()
    assert [tuple(r[:3]) for r in rows] == [
        (1, at(0), at(0)),
        (4, at(10), at(10)),
        (1, at(20), at(20)),
    ]
    assert all(r[0] == r[3] and r[1] == r[4] for r in rows)
    group = attempt(0, at(0)).groups[0]
    assert views(engine_at_0010) == [
        [(group.id, group.title, 2, at(0), at(20))],
        [(group.id, group.title, 1, at(10), at(10))],
    ]
