"""Notification rules on every provider: an event and its notification commit together,
and a storm of events of one rule in one window makes one notification saying how many."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import ValidationError

from controlroom.config import NotificationSettings, Settings
from controlroom.db.tables import event_log_items, notifications
from controlroom.db.transactions import begin_write
from controlroom.events import Severity, record_event, subscribe
from controlroom.notifications.rules import apply_rules

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
START = datetime(2026, 12, 4, 8, 0, tzinfo=UTC)


def outbox(**rule: Any) -> NotificationSettings:
    return Settings(
        notifications={
            "webhooks": [{"name": "ops", "url": "http://127.0.0.1:9/x", "secret": SECRET}],
            "rules": [
                {
                    "name": "given-up",
                    "event_types": ["RetryBatchGivenUp"],
                    "channel": "Webhook",
                    "target": "ops",
                    "window": "PT10M",
                    **rule,
                }
            ],
        }
    ).notifications


@pytest.fixture
def ruled(engine: sa.Engine) -> Iterator[sa.Engine]:
    unsubscribe = subscribe(engine, partial(apply_rules, outbox()))
    try:
        yield engine
    finally:
        unsubscribe()


def event(conn: sa.Connection, at: datetime, event_type: str = "RetryBatchGivenUp") -> None:
    record_event(
        conn,
        description="a retry batch was given up",
        severity=Severity.ERROR,
        category="Recoverability",
        event_type=event_type,
        raised_at=at,
        related_to=["/retry/1"],
    )


def rows(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(notifications)).all())


def test_five_thousand_events_in_one_window_make_one_notification_saying_so(
    ruled: sa.Engine,
) -> None:
    for chunk in range(10):
        with begin_write(ruled) as conn:
            for n in range(500):
                event(conn, START + timedelta(seconds=(chunk * 500 + n) / 10))
    (row,) = rows(ruled)
    assert row.event_count == 5000
    assert row.subject == "given-up: 5,000 events"
    assert row.source == "rule:given-up" and row.status == "Pending"
    assert row.next_attempt_at_utc == START + timedelta(minutes=10)  # sent when it ends
    assert json.loads(row.payload)["subject"] == "given-up: 5,000 events"


def test_an_event_and_its_notification_commit_or_roll_back_together(ruled: sa.Engine) -> None:
    with pytest.raises(RuntimeError), begin_write(ruled) as conn:
        event(conn, START)
        raise RuntimeError("the change the event describes failed")
    assert rows(ruled) == []
    with ruled.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(event_log_items)).scalar() == 0


def test_other_events_and_other_windows(ruled: sa.Engine) -> None:
    with begin_write(ruled) as conn:
        event(conn, START, event_type="RetryOperationCompleted")
        event(conn, START)
        event(conn, START + timedelta(minutes=10))  # the next window
    assert sorted(row.event_count for row in rows(ruled)) == [1, 1]


def test_an_event_after_its_windows_notification_was_attempted_is_not_counted_into_it(
    ruled: sa.Engine,
) -> None:
    with begin_write(ruled) as conn:
        event(conn, START)
        conn.execute(sa.update(notifications).values(status="Delivered"))
    with begin_write(ruled) as conn:
        event(conn, START + timedelta(minutes=1))
    (row,) = rows(ruled)
    assert (row.event_count, row.status) == (1, "Delivered")


def test_a_rule_naming_a_target_not_configured_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="rules: rule 'given-up' names Webhook target"):
        outbox(target="nobody")
