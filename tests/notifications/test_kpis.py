"""The outbox's oldest pending and stuck KPIs measure from when a notification became due,
on every provider: a rule's notification waiting for its coalescing window is not late
before the window ends (docs/design.md "Notification outbox", KPIs)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from controlroom.db.tables import notifications
from controlroom.db.transactions import begin_write
from controlroom.notifications.queries import measure_kpis
from controlroom.notifications.store import NewNotification, enqueue

NOW = datetime(2026, 12, 4, 8, 0, tzinfo=UTC)
STUCK = timedelta(minutes=10)
WINDOW = timedelta(hours=1)


def put(engine: sa.Engine, *, due_at: datetime | None = None, **fields: Any) -> str:
    notification = NewNotification(
        source="rule:storm" if due_at else "site:plant-7",
        channel="Webhook",
        target="ops",
        subject="s",
        body="b",
        source_event_id=f"window:{NOW.isoformat()}" if due_at else None,
    )
    with begin_write(engine) as conn:
        notification_id = enqueue(conn, notification, now=NOW, due_at=due_at).notification_id
        if fields:
            conn.execute(
                sa.update(notifications)
                .where(notifications.c.notification_id == notification_id)
                .values(**fields)
            )
    return notification_id


def kpis(engine: sa.Engine, at: datetime) -> dict[str, Any]:
    with engine.connect() as conn:
        return measure_kpis(conn, now=at, interval=timedelta(minutes=5), stuck_threshold=STUCK)[""]


def test_a_rule_notification_is_not_stuck_before_its_window_ends(engine: sa.Engine) -> None:
    put(engine, due_at=NOW + WINDOW)
    waiting = kpis(engine, NOW + timedelta(minutes=30))  # buffered, not due yet
    assert (waiting["buffered"], waiting["stuck"]) == (1, 0)
    assert waiting["oldest_pending_age_seconds"] is None
    late = kpis(engine, NOW + WINDOW + timedelta(minutes=5))
    assert (late["stuck"], late["oldest_pending_age_seconds"]) == (0, 300.0)
    stuck = kpis(engine, NOW + WINDOW + timedelta(minutes=11))
    assert (stuck["stuck"], stuck["oldest_pending_age_seconds"]) == (1, 660.0)


def test_a_site_notification_is_due_from_its_creation(engine: sa.Engine) -> None:
    put(engine)
    measured = kpis(engine, NOW + timedelta(minutes=11))
    assert (measured["stuck"], measured["oldest_pending_age_seconds"]) == (1, 660.0)


def test_one_being_sent_is_not_late_and_one_retrying_counts_from_its_creation(
    engine: sa.Engine,
) -> None:
    # Claimed for its first attempt: the claim pushed its next attempt ahead.
    put(engine, claim_token="c" * 36, next_attempt_at_utc=NOW + timedelta(minutes=15))
    assert kpis(engine, NOW + timedelta(minutes=11))["stuck"] == 0
    put(engine, status="Retrying", retry_count=2, next_attempt_at_utc=NOW + timedelta(hours=1))
    retrying = kpis(engine, NOW + timedelta(minutes=11))
    assert (retrying["stuck"], retrying["oldest_pending_age_seconds"]) == (1, 660.0)
