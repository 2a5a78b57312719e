"""Migration 0013 on each provider: the insert trigger of the group rows skips rows
inserted with their copies (the writer's) and still fills rows inserted without them,
and both directions keep every copy equal to its message's columns."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import FailedMessageStatus, failed_message_groups, failed_messages
from controlroom.db.transactions import begin_write
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailureGroup
from tests.factories import at, attempt, message_uuid

fm = failed_messages.c
fmg = failed_message_groups.c
ARCHIVED = int(FailedMessageStatus.ARCHIVED)
UNRESOLVED = int(FailedMessageStatus.UNRESOLVED)


def diverged(engine: sa.Engine) -> list[tuple[object, ...]]:
    """Group rows whose copies differ from their message's columns."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(fmg.failed_message_id, fmg.group_id)
            .join_from(failed_message_groups, failed_messages, fm.id == fmg.failed_message_id)
            .where(
                sa.or_(
                    fmg.status.is_distinct_from(fm.status),
                    fmg.first_failure_at.is_distinct_from(fm.first_failure_at),
                    fmg.last_failure_at.is_distinct_from(fm.last_failure_at),
                )
            )
        ).all()
    return [tuple(row) for row in rows]


def insert_group_row(engine: sa.Engine, n: int, title: str, **copies: object) -> None:
    with begin_write(engine) as conn:
        conn.execute(
            sa.insert(failed_message_groups).values(
                failed_message_id=message_uuid(n),
                group_id=f"group {title}",
                classifier="Other",
                title=title,
                **copies,
            )
        )


def copies_of(engine: sa.Engine, title: str) -> tuple[object, ...]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(fmg.status, fmg.first_failure_at, fmg.last_failure_at).where(
                fmg.title == title
            )
        ).one()
    return tuple(row)


def test_0013_up_and_down_keeps_the_copies_and_fills_rows_inserted_without(
    engine: sa.Engine,
) -> None:
    writer = FailedMessageBatchWriter(engine, clock=lambda: datetime(2026, 1, 2, tzinfo=UTC))
    shared = (FailureGroup("g", "Test", "shared"),)
    writer.write(IngestionBatch(attempts=[attempt(n, at(10 * n), groups=shared) for n in range(3)]))
    config = alembic_config(engine)

    command.downgrade(config, "0012")
    # Before 0013 (0011's trigger): every inserted row is looked up, whatever it was given.
    insert_group_row(
        engine, 1, "given at 0011", status=ARCHIVED, first_failure_at=at(99), last_failure_at=at(99)
    )
    assert copies_of(engine, "given at 0011") == (UNRESOLVED, at(10), at(10))
    with begin_write(engine) as conn:
        conn.execute(
            sa.update(failed_messages).where(fm.id == message_uuid(1)).values(status=ARCHIVED)
        )
    assert diverged(engine) == []

    upgrade_database(engine)
    assert diverged(engine) == []
    # 0013: a row given its copies is not looked up again (the writer's rows) ...
    insert_group_row(
        engine, 2, "given at 0013", status=ARCHIVED, first_failure_at=at(99), last_failure_at=at(99)
    )
    assert copies_of(engine, "given at 0013") == (ARCHIVED, at(99), at(99))
    with begin_write(engine) as conn:
        conn.execute(sa.delete(failed_message_groups).where(fmg.title == "given at 0013"))
    # ... and a row missing any copy takes all three from its message.
    insert_group_row(engine, 2, "none at 0013")
    insert_group_row(engine, 1, "status only at 0013", status=UNRESOLVED)
    assert copies_of(engine, "none at 0013") == (UNRESOLVED, at(20), at(20))
    assert copies_of(engine, "status only at 0013") == (ARCHIVED, at(10), at(10))
    writer.write(IngestionBatch(attempts=[attempt(1, at(30), groups=shared)]))
    assert diverged(engine) == []

    command.downgrade(config, "0012")
    assert diverged(engine) == []
    insert_group_row(engine, 0, "none at 0011")
    assert copies_of(engine, "none at 0011") == (UNRESOLVED, at(0), at(0))
    assert diverged(engine) == []
    upgrade_database(engine)
