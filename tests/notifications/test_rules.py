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
from controlroom.db.tables import event_log_items, notifications, rejected_telemetry
from controlroom.db.transactions import begin_write
from controlroom.events import Severity, record_event, subscribe
from controlroom.notifications.rules import apply_rules

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
START = datetime(2026, 12, 4, 8, 0, tzinfo=UTC)


def configured(site: str | None) -> list[dict[str, str]]:
    """The ``sites`` entry a rule's ``site`` filter needs (it must name a configured
    site)."""
    return [] if site is None else [{"id": site, "base_url": "http://127.0.0.1:9"}]


def outbox(**rule: Any) -> NotificationSettings:
    return Settings(
        sites=configured(rule.get("site")),
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
        },
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


@pytest.mark.parametrize("claimed", ["Delivered", "claimed"])
def test_an_event_after_its_windows_notification_was_claimed_starts_the_next_windows(
    ruled: sa.Engine, claimed: str
) -> None:
    with begin_write(ruled) as conn:
        event(conn, START)
        if claimed == "claimed":
            conn.execute(sa.update(notifications).values(claim_token="a-dispatcher"))
        else:
            conn.execute(sa.update(notifications).values(status=claimed))
    with begin_write(ruled) as conn:
        event(conn, START + timedelta(minutes=1))
    with begin_write(ruled) as conn:
        event(conn, START + timedelta(minutes=2))
    first, late = sorted(rows(ruled), key=lambda row: row.next_attempt_at_utc)
    assert first.event_count == 1
    assert (late.event_count, late.status) == (2, "Pending")
    assert late.next_attempt_at_utc == START + timedelta(minutes=20)  # the next window's end
    assert late.subject == "given-up: 2 events"


def test_a_late_event_walks_past_every_window_already_sent(ruled: sa.Engine) -> None:
    for minutes in (0, 10):
        with begin_write(ruled) as conn:
            event(conn, START + timedelta(minutes=minutes))
            conn.execute(sa.update(notifications).values(status="Delivered"))
    with begin_write(ruled) as conn:
        event(conn, START + timedelta(minutes=1))
    pending = [row for row in rows(ruled) if row.status == "Pending"]
    assert [row.next_attempt_at_utc for row in pending] == [START + timedelta(minutes=30)]


@pytest.mark.parametrize(
    ("rule", "related_to", "severity", "fires"),
    [
        ({"endpoint": "Sales"}, ["/endpoint/Sales"], Severity.ERROR, True),
        ({"endpoint": "Sales"}, ["/endpoint/Billing"], Severity.ERROR, False),
        ({"group": "g1"}, ["/group/g1", "/endpoint/Sales"], Severity.ERROR, True),
        ({"group": "g1"}, ["/group/g2"], Severity.ERROR, False),
        ({"site": "plant-7"}, ["/site/plant-7"], Severity.WARNING, True),
        ({"site": "plant-7"}, ["/site/plant-8"], Severity.WARNING, False),
        ({"min_severity": "error"}, [], Severity.WARNING, False),
        ({"min_severity": "error"}, [], Severity.CRITICAL, True),
        ({"site": "plant-7", "min_severity": "error"}, ["/site/plant-7"], Severity.INFO, False),
    ],
)
def test_a_rule_filters_by_endpoint_group_site_and_severity(
    engine: sa.Engine, rule: dict[str, str], related_to: list[str], severity: Severity, fires: bool
) -> None:
    unsubscribe = subscribe(engine, partial(apply_rules, outbox(**rule)))
    try:
        with begin_write(engine) as conn:
            record_event(
                conn,
                description="something happened",
                severity=severity,
                category="Recoverability",
                event_type="RetryBatchGivenUp",
                raised_at=START,
                related_to=related_to,
            )
    finally:
        unsubscribe()
    assert len(rows(engine)) == (1 if fires else 0)


def test_a_rule_naming_a_target_not_configured_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="rules: rule 'given-up' names Webhook target"):
        outbox(target="nobody")


def test_a_rendering_the_store_refuses_is_kept_whole_and_the_event_commits(
    engine: sa.Engine,
) -> None:
    settings = outbox()
    # Settings cannot name a rule this long; a rendering can still outgrow a column.
    bad = settings.rules[0].model_copy(update={"name": "r" * 300})
    unsubscribe = subscribe(
        engine, partial(apply_rules, settings.model_copy(update={"rules": [bad]}))
    )
    try:
        with begin_write(engine) as conn:
            event(conn, START)
    finally:
        unsubscribe()
    assert rows(engine) == []
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(event_log_items)).scalar() == 1
        (kept,) = conn.execute(sa.select(rejected_telemetry)).all()
    assert kept.source == "notification:rule"  # the name is too long for the column
    assert kept.reason.startswith("source: 305 characters")
    assert json.loads(kept.packet)["subject"].startswith("r" * 300)
