"""Migration 0022 on each provider: the group rows stored before it fill the failures per
hour of the hours kept (their latest failure each), later failures are counted by the
triggers, and a downgrade gives 0021's schema back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import GROUP_HOURS_KEPT
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from tests.nsb import failed_headers


def _fail(engine: sa.Engine, message_id: str, when: datetime) -> None:
    attempt = parse_failed_message(
        failed_headers(message_id, failed_at=when), b"{}", max_body_size_to_store=102_400
    )
    FailedMessageBatchWriter(engine).write(IngestionBatch(attempts=[attempt]))


def _hours(engine: sa.Engine) -> dict[int, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT hour, sum(n) FROM failed_message_group_hours GROUP BY hour")
        ).all()
    return {int(hour): int(n) for hour, n in rows}


def test_0022_counts_the_failures_stored_before_it_and_after(engine: sa.Engine) -> None:
    config = alembic_config(engine)
    command.downgrade(config, "0021")
    now = datetime.now(UTC).replace(minute=30, second=0, microsecond=0)
    recent, old = now - timedelta(hours=1), now - timedelta(hours=GROUP_HOURS_KEPT + 5)
    _fail(engine, "recent", recent)
    _fail(engine, "old", old)

    upgrade_database(engine)
    _fail(engine, "after", now)

    hour_of = lambda instant: int(instant.timestamp()) // 3600  # noqa: E731
    groups_per_message = _hours(engine)[hour_of(now)]  # one row per classifier's group
    assert groups_per_message >= 1
    assert _hours(engine) == {
        hour_of(recent): groups_per_message,
        hour_of(now): groups_per_message,
    }
    command.downgrade(config, "0021")
    with engine.connect() as conn:
        assert not sa.inspect(conn).has_table("failed_message_group_hours")
    upgrade_database(engine)
