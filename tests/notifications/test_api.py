"""/api/notifications on every provider: list, get, KPIs, and the operator's Retry and
Discard with their outcomes and audit rows (404 and no audit row for a purged one)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import AuthToken, Settings
from controlroom.db.tables import audit_log, event_log_items, kpi_samples, notifications
from controlroom.db.transactions import begin_write
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.notifications.history import take_sample
from controlroom.notifications.store import (
    ActionOutcome,
    Command,
    NewNotification,
    act_on_parked,
    enqueue,
)

OPERATOR = "operator-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"
NOW = datetime(2025, 6, 1, 8, 0, tzinfo=UTC)


@pytest.fixture
def api(tmp_path: Path, database_url: str, engine: sa.Engine) -> Iterator[TestClient]:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        auth_tokens=[
            AuthToken(name="olga", token=OPERATOR, role="operator"),
            AuthToken(name="rita", token=READER, role="reader"),
        ],
    )
    app = create_app(settings, engine, FileSystemBodyStore(tmp_path / "bodies"))
    with TestClient(app, headers={"Authorization": f"Bearer {OPERATOR}"}) as client:
        yield client


def put(engine: sa.Engine, status: str = "Parked", at: datetime = NOW, **fields: Any) -> str:
    values: dict[str, Any] = {
        "source": "site:plant-7",
        "channel": "Webhook",
        "target": "ops",
        "subject": "Pump 3 stopped",
        "body": "details",
    }
    values.update(fields)
    with begin_write(engine) as conn:
        notification_id = enqueue(conn, NewNotification(**values), now=at).notification_id
        conn.execute(
            sa.update(notifications)
            .where(notifications.c.notification_id == notification_id)
            .values(status=status, retry_count=10, last_error="HTTP 500")
        )
    return notification_id


def audit_rows(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(audit_log)).all())


def test_retry_of_a_parked_notification_applies_once_with_one_audit_row(
    api: TestClient, engine: sa.Engine
) -> None:
    notification_id = put(engine)
    answer = api.post(f"/api/notifications/{notification_id}/retry")
    assert answer.status_code == 200
    assert answer.json()["outcome"] == "Applied" and answer.json()["status"] == "Pending"
    stored = api.get(f"/api/notifications/{notification_id}").json()
    assert (stored["status"], stored["retry_count"]) == ("Pending", 0)
    (event,) = audit_rows(engine)
    assert (event.actor, event.action, event.correlation_id) == (
        "olga",
        "NotificationRetried",
        notification_id,
    )
    assert event.source_site == "plant-7"
    again = api.post(f"/api/notifications/{notification_id}/retry")
    assert again.status_code == 409
    assert again.json() == {
        "outcome": "NotParked",
        "status": "Pending",
        "message": again.json()["message"],
    }
    assert len(audit_rows(engine)) == 1
    with engine.connect() as conn:
        types = conn.execute(sa.select(event_log_items.c.event_type)).scalars().all()
    assert types == ["NotificationRetried"]


def test_discard_ends_a_parked_notification(api: TestClient, engine: sa.Engine) -> None:
    notification_id = put(engine)
    answer = api.post(f"/api/notifications/{notification_id}/discard")
    assert (answer.status_code, answer.json()["status"]) == (200, "Discarded")
    stored = api.get(f"/api/notifications/{notification_id}").json()
    assert stored["terminal_at_utc"] is not None
    assert [row.action for row in audit_rows(engine)] == ["NotificationDiscarded"]


def test_an_action_on_a_delivered_notification_is_409_naming_its_status(
    api: TestClient, engine: sa.Engine
) -> None:
    notification_id = put(engine, status="Delivered")
    answer = api.post(f"/api/notifications/{notification_id}/retry")
    assert (answer.status_code, answer.json()["status"]) == (409, "Delivered")
    assert audit_rows(engine) == []


@pytest.mark.parametrize("command", ["retry", "discard"])
def test_an_action_on_a_purged_or_unknown_notification_is_404_with_no_audit_row(
    api: TestClient, engine: sa.Engine, command: str
) -> None:
    notification_id = put(engine)
    with begin_write(engine) as conn:
        conn.execute(sa.delete(notifications))  # the purge took it
    for target in (notification_id, "00000000-0000-4000-8000-000000000000"):
        answer = api.post(f"/api/notifications/{target}/{command}")
        assert (answer.status_code, answer.json()["detail"]) == (404, "notification not found")
    assert audit_rows(engine) == []


def test_two_operators_at_once_one_applied_one_not_parked_one_audit_row(
    engine: sa.Engine,
) -> None:
    notification_id = put(engine)
    start = threading.Barrier(2)
    outcomes: list[ActionOutcome] = []

    def act(operator: str) -> None:
        start.wait()
        result = act_on_parked(engine, notification_id, Command.RETRY, operator, now=NOW)
        outcomes.append(result.outcome)

    threads = [threading.Thread(target=act, args=(name,)) for name in ("olga", "otto")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == [ActionOutcome.APPLIED, ActionOutcome.NOT_PARKED]
    assert len(audit_rows(engine)) == 1


def test_a_reader_lists_but_may_not_act(api: TestClient, engine: sa.Engine) -> None:
    notification_id = put(engine)
    reader = {"Authorization": f"Bearer {READER}"}
    assert api.get("/api/notifications", headers=reader).status_code == 200
    refused = api.post(f"/api/notifications/{notification_id}/retry", headers=reader)
    assert refused.status_code == 403
    assert audit_rows(engine) == []


def test_the_list_filters_by_status_and_pages_by_keyset(api: TestClient, engine: sa.Engine) -> None:
    parked = [put(engine, at=NOW + timedelta(seconds=n)) for n in range(5)]
    put(engine, status="Delivered")
    seen: list[str] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"status": "Parked", "limit": 2}
        if after:
            params["after"] = after
        page = api.get("/api/notifications", params=params).json()
        seen += [item["notification_id"] for item in page["items"]]
        assert all(item["status"] == "Parked" for item in page["items"])
        assert all("payload" not in item for item in page["items"])
        after = page["next_cursor"]
        if after is None:
            break
    assert seen == list(reversed(parked))
    refused = api.get("/api/notifications", params={"after": "nonsense"})
    assert refused.status_code == 422, refused.text
    assert [error["loc"] for error in refused.json()["detail"]] == [["query", "after"]]


@pytest.mark.parametrize("name", ["status", "channel", "source", "target", "limit", "after"])
def test_a_filter_given_twice_is_400_never_one_of_them(api: TestClient, name: str) -> None:
    values = {"status": "Parked", "channel": "Email", "limit": "2"}.get(name, "x")
    answer = api.get("/api/notifications", params=[(name, values), (name, values)])
    assert answer.status_code == 400
    assert answer.json()["detail"] == f"{name}: give it at most once"


def test_kpis_globally_and_per_channel(api: TestClient, engine: sa.Engine) -> None:
    put(engine)
    put(engine, status="Pending", channel="Email", target="oncall")
    kpis = api.get("/api/notifications/kpis").json()
    assert kpis["global"]["parked"] == 1 and kpis["global"]["buffered"] == 1
    assert kpis["channels"]["Email"]["buffered"] == 1
    assert kpis["channels"]["Webhook"]["parked"] == 1
    assert kpis["global"]["stuck"] == 1  # created in the test's past, long ago
    assert kpis["global"]["oldest_pending_age_seconds"] > 0


def test_metrics_carry_the_outbox_kpis_per_channel(api: TestClient, engine: sa.Engine) -> None:
    put(engine)
    text = api.get("/metrics").text
    assert 'controlroom_notifications_parked{channel="Webhook"} 1.0' in text
    assert 'controlroom_notifications_buffered{channel="Email"} 0.0' in text


def test_the_sampler_writes_each_kpi_of_each_scope(engine: sa.Engine) -> None:
    put(engine)
    settings = Settings(database_url=str(engine.url))
    written = take_sample(engine, settings, NOW + timedelta(days=1))
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(kpi_samples).where(kpi_samples.c.source == "notifications")
        ).all()
    assert len(rows) == written
    parked = {(row.scope, row.scope_key): row.value for row in rows if row.metric == "parked"}
    assert parked == {("global", ""): 1.0, ("channel", "Webhook"): 1.0, ("channel", "Email"): 0.0}


def test_the_kpi_history_answers_a_channel_s_series_to_a_reader(
    api: TestClient, engine: sa.Engine
) -> None:
    put(engine)
    settings = Settings(database_url=str(engine.url))
    first = NOW + timedelta(days=1)
    take_sample(engine, settings, first)
    put(engine, subject="second")
    take_sample(engine, settings, first + timedelta(minutes=1))
    window = {"from": NOW.isoformat(), "to": (NOW + timedelta(days=2)).isoformat()}
    reader = {"Authorization": f"Bearer {READER}"}
    answer = api.get(
        "/api/notifications/kpi-history",
        params={"metric": "parked", "scope": "channel", "scope_key": "Webhook", **window},
        headers=reader,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["metric"], body["scope"], body["scope_key"]) == ("parked", "channel", "Webhook")
    assert [point["value"] for point in body["points"]] == [1.0, 2.0]
    whole = api.get("/api/notifications/kpi-history", params={"metric": "parked", **window})
    assert [point["value"] for point in whole.json()["points"]] == [1.0, 2.0]
    # The site calls' history is another source: none of these samples is theirs.
    theirs = api.get("/api/kpi-history", params={"metric": "parked", **window})
    assert theirs.json()["points"] == []
    site_scope = {"metric": "parked", "scope": "site", "scope_key": "plant-7"}
    assert api.get("/api/notifications/kpi-history", params=site_scope).status_code == 422


@pytest.mark.parametrize("action", ["", "/retry", "/discard"])
def test_a_notification_is_named_by_its_guid_in_any_case(
    api: TestClient, engine: sa.Engine, action: str
) -> None:
    notification_id = put(engine)
    upper = api.post if action else api.get

    answer = upper(f"/api/notifications/{notification_id.upper()}{action}")

    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("action", ["", "/retry", "/discard"])
def test_a_notification_id_that_is_no_guid_is_a_422_naming_it(api: TestClient, action: str) -> None:
    call = api.post if action else api.get

    answer = call(f"/api/notifications/not-a-guid{action}")

    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["path", "notification_id"]


def test_times_are_answered_in_the_site_call_halfs_one_format(
    api: TestClient, engine: sa.Engine
) -> None:
    # UTC, seven fractional digits, Z: one format across the API's own routes (README).
    notification_id = put(engine)
    round_trip = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{7}Z$")

    (listed,) = api.get("/api/notifications").json()["items"]
    shown = api.get(f"/api/notifications/{notification_id}").json()
    kpis = api.get("/api/notifications/kpis").json()

    for answer in (listed, shown):
        assert round_trip.match(answer["created_at_utc"]), answer
        assert round_trip.match(answer["updated_at_utc"]), answer
    assert round_trip.match(kpis["generated_at_utc"]), kpis
