"""The outbox's retention purge on every provider: terminal rows past retention go;
Pending, Retrying and Parked ones stay, however old; a Retry of a purged one is 404."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from controlroom.db.tables import notifications
from controlroom.db.transactions import begin_write
from controlroom.notifications.retention import purge_notifications
from controlroom.notifications.store import ActionOutcome, Command, act_on_parked
from tests.notifications.test_api import put

NOW = datetime(2026, 12, 4, 8, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=400)


def test_terminal_rows_past_retention_are_purged_and_live_ones_never(engine: sa.Engine) -> None:
    kept: dict[str, str] = {}
    for status in ("Delivered", "Failed", "Discarded", "Pending", "Retrying", "Parked"):
        notification_id = put(engine, status=status, at=OLD, subject=status)
        kept[status] = notification_id
        if status in ("Delivered", "Failed", "Discarded"):
            with begin_write(engine) as conn:
                conn.execute(
                    sa.update(notifications)
                    .where(notifications.c.notification_id == notification_id)
                    .values(terminal_at_utc=OLD)
                )
    recent = put(engine, status="Delivered", at=NOW)
    with begin_write(engine) as conn:
        conn.execute(
            sa.update(notifications)
            .where(notifications.c.notification_id == recent)
            .values(terminal_at_utc=NOW - timedelta(days=1))
        )
    assert purge_notifications(engine, now=NOW, retention_days=365, chunk=2) == 3
    with engine.connect() as conn:
        left = set(conn.execute(sa.select(notifications.c.status)).scalars())
    assert left == {"Pending", "Retrying", "Parked", "Delivered"}
    purged = kept["Discarded"]
    result = act_on_parked(engine, purged, Command.RETRY, "olga", now=NOW)
    assert result.outcome is ActionOutcome.NOT_FOUND
