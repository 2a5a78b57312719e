"""Migration 0030 on each provider: notifications get ``failure_groups`` (NULL for the rows
already there, which send as they were), and a downgrade takes it back."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database


def columns(engine: sa.Engine) -> set[str]:
    return {column["name"] for column in sa.inspect(engine).get_columns("notifications")}


def test_0030_adds_the_failure_groups_of_a_rules_notification(engine: sa.Engine) -> None:
    command.downgrade(alembic_config(engine), "0029")
    assert "failure_groups" not in columns(engine)
    now = datetime(2026, 12, 4, 8, 0, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO notifications (notification_id, source, channel, target, subject, "
                "body, severity, status, retry_count, created_at_utc, updated_at_utc, "
                "next_attempt_at_utc) VALUES ('6f0d5a52-2a43-4c55-9d0e-8f1d0c6a9b31', "
                "'rule:r', 'Webhook', 'ops', 's', 'b', 'Info', 'Pending', 0, :now, :now, :now)"
            ),
            {"now": now},
        )
    upgrade_database(engine)
    assert "failure_groups" in columns(engine)
    with engine.connect() as conn:
        kept = conn.execute(sa.text("SELECT subject, failure_groups FROM notifications")).one()
    assert tuple(kept) == ("s", None)
    command.downgrade(alembic_config(engine), "0029")
    assert "failure_groups" not in columns(engine)
    upgrade_database(engine)
