"""Migration 0020 on each provider: group rows stored before it get their message's sort
keys, rows inserted without copies get all of them, a change of a message's sort keys
reaches its group rows, and a downgrade leaves 0011's copies and triggers working."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import (
    GROUP_COPIES,
    FailedMessageStatus,
    failed_message_groups,
    failed_messages,
)
from controlroom.db.transactions import begin_write
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailureGroup
from tests.factories import at, attempt, message_uuid

fm = failed_messages.c
fmg = failed_message_groups.c
ARCHIVED = int(FailedMessageStatus.ARCHIVED)
OLD_COPIES = ("status", "first_failure_at", "last_failure_at")


def diverged(engine: sa.Engine, copies: tuple[str, ...] = GROUP_COPIES) -> list[object]:
    """Group rows whose ``copies`` differ from their message's columns."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(fmg.failed_message_id, fmg.group_id)
                .join_from(failed_message_groups, failed_messages, fm.id == fmg.failed_message_id)
                .where(sa.or_(*(fmg[c].is_distinct_from(fm[c]) for c in copies)))
            ).all()
        )


def insert_bare_group_row(engine: sa.Engine, n: int, title: str) -> None:
    """A group row of message ``n`` inserted without any copy (not the writer's way)."""
    with begin_write(engine) as conn:
        conn.execute(
            sa.insert(failed_message_groups).values(
                failed_message_id=message_uuid(n),
                group_id=f"group {title}",
                classifier="Other",
                title=title,
            )
        )


def test_0020_fills_keeps_and_gives_back_the_sort_key_copies(engine: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(engine, clock=lambda: datetime(2026, 1, 2, tzinfo=UTC))
    shared = (FailureGroup("g", "Test", "shared"),)
    writer.write(
        IngestionBatch(
            attempts=[
                dataclasses.replace(
                    attempt(n, at(10 * n), groups=shared),
                    time_sent=at(10 * n - 1) if n else None,
                    message_type=f"Type{n}" if n != 1 else None,
                )
                for n in range(3)
            ]
        )
    )
    config = alembic_config(engine)

    command.downgrade(config, "0019")
    insert_bare_group_row(engine, 0, "bare at 0019")
    assert diverged(engine, OLD_COPIES) == []

    upgrade_database(engine)
    assert diverged(engine) == []  # the rows stored before, filled by the migration
    insert_bare_group_row(engine, 2, "bare at 0020")
    with begin_write(engine) as conn:
        conn.execute(
            sa.update(failed_messages)
            .where(fm.id == message_uuid(1))
            .values(time_sent=at(5), message_type="Changed", message_id="renamed")
        )
        conn.execute(
            sa.update(failed_messages)
            .where(fm.id == message_uuid(2))
            .values(status=ARCHIVED, last_modified=at(99))
        )
    assert diverged(engine) == []
    with engine.connect() as conn:
        assert conn.execute(
            sa.select(fmg.time_sent, fmg.message_type, fmg.message_id).where(
                fmg.failed_message_id == message_uuid(1), fmg.group_id == "g"
            )
        ).one() == (at(5), "Changed", "renamed")

    command.downgrade(config, "0019")
    insert_bare_group_row(engine, 1, "bare at 0019 again")
    with begin_write(engine) as conn:
        conn.execute(
            sa.update(failed_messages).where(fm.id == message_uuid(0)).values(status=ARCHIVED)
        )
    assert diverged(engine, OLD_COPIES) == []
    upgrade_database(engine)
    assert diverged(engine) == []
