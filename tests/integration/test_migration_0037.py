"""Migration 0037 on each provider: a failure counts in the hour of its whole seconds
(SQLite rounded the microseconds to the millisecond first, into the next hour), a
failure stamped far ahead keeps its group's present hours, and a downgrade gives 0036's
triggers back."""

from __future__ import annotations

import calendar
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from tests.integration.test_migration_0022 import _fail, _hours


def hour_of(instant: datetime) -> int:
    return calendar.timegm(instant.utctimetuple()) // 3600


def test_0037_counts_each_failure_in_the_hour_of_its_whole_seconds(engine: sa.Engine) -> None:
    now = datetime.now(UTC).replace(minute=30, second=0, microsecond=0)
    last_instant = now.replace(minute=59, second=59, microsecond=999_600) - timedelta(hours=1)
    _fail(engine, "present", now)
    _fail(engine, "ahead", now + timedelta(days=400))  # a sender's clock a year ahead
    _fail(engine, "last instant", last_instant)

    hours = _hours(engine)
    per_message = hours[hour_of(now)]
    assert per_message >= 1
    assert hours == {
        hour_of(now): per_message,
        hour_of(now + timedelta(days=400)): per_message,
        hour_of(last_instant): per_message,
    }

    command.downgrade(alembic_config(engine), "0036")
    with engine.connect() as conn:
        triggers = " ".join(
            conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name LIKE '%hours%'"
            ).scalars()
            if engine.dialect.name == "sqlite"
            else []
        )
    assert "substr" not in triggers
    upgrade_database(engine)
    _fail(engine, "again", now)
    assert _hours(engine)[hour_of(now)] == 2 * per_message
