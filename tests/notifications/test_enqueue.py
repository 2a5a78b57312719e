"""Enqueue, on every provider: the caller's transaction, idempotent by id and by
(rule, source event), and refusal of what cannot be stored whole."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from controlroom.db.tables import notifications
from controlroom.db.transactions import begin_write
from controlroom.notifications.store import NewNotification, NotificationRejected, enqueue

NOW = datetime(2026, 12, 4, 8, 0, tzinfo=UTC)


def webhook(**changes: object) -> NewNotification:
    fields: dict[str, object] = {
        "source": "rule:new-group",
        "channel": "Webhook",
        "target": "ops",
        "subject": "A new failure group",
        "body": "Group X appeared",
        "source_event_id": "event-1",
    }
    fields.update(changes)
    return NewNotification(**fields)  # type: ignore[arg-type]


def count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(notifications)).scalar_one()


def test_a_notification_is_stored_pending_and_due_with_its_payload(engine: sa.Engine) -> None:
    with begin_write(engine) as conn:
        stored = enqueue(conn, webhook(), now=NOW)
    assert stored.created
    with engine.connect() as conn:
        row = conn.execute(sa.select(notifications)).one()
    assert row.notification_id == stored.notification_id
    assert (row.status, row.retry_count, row.next_attempt_at_utc) == ("Pending", 0, NOW)
    assert row.payload is not None and stored.notification_id in row.payload


def test_it_commits_or_rolls_back_with_the_callers_transaction(engine: sa.Engine) -> None:
    with pytest.raises(RuntimeError), begin_write(engine) as conn:
        enqueue(conn, webhook(), now=NOW)
        raise RuntimeError("the event's write failed")
    assert count(engine) == 0


def test_a_replayed_event_of_one_rule_makes_no_second_notification(engine: sa.Engine) -> None:
    with begin_write(engine) as conn:
        first = enqueue(conn, webhook(), now=NOW)
    with begin_write(engine) as conn:
        again = enqueue(conn, webhook(body="replayed"), now=NOW)
        other_rule = enqueue(conn, webhook(source="rule:other"), now=NOW)
    assert again.notification_id == first.notification_id and not again.created
    assert other_rule.created
    assert count(engine) == 2


def test_a_sites_notification_is_idempotent_on_its_id(engine: sa.Engine) -> None:
    given = str(uuid.uuid4())
    site = webhook(source="site:plant-7", source_event_id=None, notification_id=given)
    with begin_write(engine) as conn:
        assert enqueue(conn, site, now=NOW).created
        assert not enqueue(conn, site, now=NOW).created
    assert count(engine) == 1


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"subject": "s" * 257}, "subject"),
        ({"target": "t" * 257}, "target"),
        ({"source": "rule:" + "r" * 200}, "source"),
        ({"source": "somewhere"}, "source"),
        ({"channel": "Pager"}, "channel"),
        ({"severity": "Loud"}, "severity"),
        ({"notification_id": "not-a-guid", "source_event_id": None}, "notification_id"),
    ],
)
def test_what_cannot_be_stored_whole_is_refused_naming_the_field(
    engine: sa.Engine, changes: dict[str, object], field: str
) -> None:
    with pytest.raises(NotificationRejected) as refused, begin_write(engine) as conn:
        enqueue(conn, webhook(**changes), now=NOW)
    assert refused.value.field == field
    assert count(engine) == 0


def test_the_store_itself_refuses_an_over_long_subject(engine: sa.Engine) -> None:
    row = {
        "notification_id": str(uuid.uuid4()),
        "source": "rule:r",
        "channel": "Email",
        "target": "ops",
        "subject": "s" * 257,
        "body": "",
        "severity": "Info",
        "status": "Pending",
        "retry_count": 0,
        "created_at_utc": NOW,
        "updated_at_utc": NOW,
    }
    with pytest.raises(sa.exc.DBAPIError), begin_write(engine) as conn:
        conn.execute(sa.insert(notifications), row)
    assert count(engine) == 0
