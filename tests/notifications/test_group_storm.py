"""A storm of real failures of one group within a rule's window, on every provider: 5,000
failed messages parsed from NServiceBus headers and written by the error writer, batch
by batch as the intake writes them, raise a handful of events (the group appeared, a
threshold passed), never one per failure; the rule makes exactly one notification, and
the one delivered says 5,000 (docs/design.md "Notification rules")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import cache, partial
from typing import Any

import pytest
import sqlalchemy as sa
from standardwebhooks import Webhook

from controlroom.config import Settings
from controlroom.db.tables import notifications
from controlroom.errors.ingest.grouping import CAUSE_CLASSIFIERS
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt
from controlroom.events import EventLogItem, Severity, group_path, subscribe
from controlroom.notifications.rules import COUNTED_GROUPS_LIMIT, apply_rules, with_group
from tests.notifications.receivers import WebhookReceiver, webhook_receiver
from tests.notifications.test_dispatch import SECRET, Clock, dispatch
from tests.nsb import failed_headers

WINDOW = timedelta(minutes=10)
START = datetime.fromtimestamp(
    (datetime.now(UTC).timestamp() // WINDOW.total_seconds() - 2) * WINDOW.total_seconds(), UTC
)
"""The start of a PT10M window that ended at least 10 minutes ago: its notification is
due, and its signature's timestamp (the clock's, now) is one a receiver takes."""
STORM = 5000
BATCH = 500  # the intake's default batch


@cache
def storm() -> tuple[FailedAttempt, ...]:
    """5,000 messages failing with one exception in one handler, 0.1 s apart from START."""
    return tuple(
        parse_failed_message(
            failed_headers(f"storm-{n}", failed_at=START + timedelta(seconds=n / 10)),
            b'{"order": %d}' % n,
            max_body_size_to_store=102_400,
        )
        for n in range(STORM)
    )


def cause_group() -> str:
    (group,) = [g.id for g in storm()[0].groups if g.classifier in CAUSE_CLASSIFIERS]
    return group


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with webhook_receiver() as hook:
        yield hook


def notified(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(notifications)).all())


@pytest.mark.parametrize(
    "rule",
    [
        {"event_types": ["FailureGroupAppeared"]},
        {"event_types": ["GroupFailuresPassedThreshold"], "group": "cause"},
        {"event_types": ["FailureGroupAppeared", "GroupFailuresPassedThreshold"]},
    ],
    ids=["appeared", "threshold-of-the-group", "both-any-group"],
)
def test_5000_real_failures_of_one_group_in_a_window_make_one_notification_saying_5000(
    engine: sa.Engine, database_url: str, receiver: WebhookReceiver, rule: dict[str, Any]
) -> None:
    if rule.get("group") == "cause":
        rule = {**rule, "group": cause_group()}
    settings = Settings(
        database_url=database_url,
        notifications={
            "webhooks": [{"name": "ops", "url": receiver.url, "secret": SECRET}],
            "rules": [
                {"name": "storm", "channel": "Webhook", "target": "ops", "window": "PT10M", **rule}
            ],
        },
    )
    unsubscribe = subscribe(engine, partial(apply_rules, settings.notifications))
    try:
        writer = FailedMessageBatchWriter(
            engine, clock=lambda: START + timedelta(minutes=9), alert_group_failures=1000
        )
        messages = storm()
        for first in range(0, STORM, BATCH):
            writer.write(IngestionBatch(attempts=list(messages[first : first + BATCH])))
    finally:
        unsubscribe()
    (row,) = notified(engine)  # one, however many events the storm raised
    assert row.status == "Pending" and row.next_attempt_at_utc == START + timedelta(minutes=10)

    clock = Clock()  # now: the window ended, its notification is due
    assert dispatch(settings, engine, clock) == 1
    (request,) = receiver.requests
    payload = Webhook(SECRET).verify(request.body, request.headers)
    assert payload["notification_id"] == row.notification_id
    assert payload["subject"].startswith("storm: 5,000 failed messages")
    assert "\n- 5,000: " in payload["body"]
    assert f"(group {cause_group()}" in payload["body"]
    (sent,) = notified(engine)
    assert (sent.status, sent.subject, sent.body) == (
        "Delivered",
        payload["subject"],
        payload["body"],
    )  # the row says what was sent
    counted = json.loads(sent.failure_groups)["groups"]
    assert counted[cause_group()]["failed"] == STORM


def test_the_count_is_made_once_and_the_same_bytes_are_sent_on_every_attempt(
    engine: sa.Engine, database_url: str, receiver: WebhookReceiver
) -> None:
    settings = Settings(
        database_url=database_url,
        notifications={
            "webhooks": [{"name": "ops", "url": receiver.url, "secret": SECRET}],
            "rules": [
                {
                    "name": "storm",
                    "event_types": ["FailureGroupAppeared"],
                    "channel": "Webhook",
                    "target": "ops",
                    "window": "PT10M",
                }
            ],
        },
    )
    unsubscribe = subscribe(engine, partial(apply_rules, settings.notifications))
    writer = FailedMessageBatchWriter(engine, clock=lambda: START + timedelta(minutes=1))
    try:
        writer.write(IngestionBatch(attempts=list(storm()[:10])))
    finally:
        unsubscribe()
    clock = Clock()
    receiver.status = 500
    dispatch(settings, engine, clock)
    # More failures of the window come late, after the first attempt: not counted again.
    writer.write(IngestionBatch(attempts=list(storm()[10:20])))
    receiver.status = 204
    clock.advance()
    dispatch(settings, engine, clock)
    first, second = receiver.requests
    assert first.body == second.body
    assert json.loads(first.body)["subject"] == "storm: 10 failed messages"


def group_event(event_type: str, group_id: str) -> EventLogItem:
    return EventLogItem(
        id=group_id,
        description="",
        severity=Severity.WARNING,
        raised_at=START,
        related_to=(group_path(group_id), "/endpoint/Sales"),
        category="MessageFailures",
        event_type=event_type,
    )


def test_a_notification_names_at_most_50_groups_and_says_when_more_came() -> None:
    end = START + timedelta(minutes=10)
    stored = None
    for n in range(COUNTED_GROUPS_LIMIT + 2):
        stored = with_group(
            stored, group_event("GroupFailuresPassedThreshold", f"g{n}"), START, end
        )
    # A group first seen passing a threshold, then appearing in the window: new.
    stored = with_group(stored, group_event("FailureGroupAppeared", "g0"), START, end)
    assert stored is not None
    state = json.loads(stored)
    assert (len(state["groups"]), state["more"]) == (COUNTED_GROUPS_LIMIT, True)
    assert state["groups"]["g0"] == {"new": True, "failed": None}
    assert state["groups"]["g1"] == {"new": False, "failed": None}
    assert (state["from"], state["to"]) == (START.isoformat(), end.isoformat())
    assert with_group(stored, group_event("RetryBatchGivenUp", "g9"), START, end) is stored
