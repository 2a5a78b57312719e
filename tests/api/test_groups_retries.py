"""A group's retry in its group views, on every provider: the ``operation_*`` fields while
it prepares and forwards, the completed outcome awaiting acknowledgement, the group that
holds no Unresolved message any more, and acknowledging it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.db.tables import retry_operations
from controlroom.errors.ingest.grouping import EXCEPTION_TYPE_AND_STACK_TRACE
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt
from tests.api.failure_fixture import TIMEOUT, expected_groups, ingest_fixture
from tests.api.failure_fixture import parse_utc as utc
from tests.nsb import failed_headers

STARTED = datetime(2026, 2, 1, 9, 0, tzinfo=UTC)
IDLE = {"operation_status": "None", "operation_progress": 0.0, "need_user_acknowledgement": False}

Attempts = dict[str, list[FailedAttempt]]


@pytest.fixture
def attempts(writer: FailedMessageBatchWriter) -> Attempts:
    return ingest_fixture(writer)


@pytest.fixture
def timeout_group(attempts: Attempts) -> tuple[str, str, int]:
    """(id, title, count) of the TimeoutException group of the fixture."""
    groups = expected_groups(attempts, EXCEPTION_TYPE_AND_STACK_TRACE, attempts)
    return next(
        (group_id, group.title, group.count)
        for group_id, group in groups.items()
        if group.title.startswith(TIMEOUT)
    )


def record_retry(engine: sa.Engine, group_id: str, title: str, **values: Any) -> str:
    """A FailureGroup retry operation of ``group_id``, as the retry flow records it."""
    row: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "retry_type": "FailureGroup",
        "target": group_id,
        "originator": title,
        "classifier": EXCEPTION_TYPE_AND_STACK_TRACE,
        "message_count": 4,
        "forwarded_count": 0,
        "skipped_count": 0,
        "failed": False,
        "acknowledged": False,
        "started_at": STARTED,
        "last_modified": STARTED,
    } | values
    with engine.begin() as conn:
        conn.execute(sa.insert(retry_operations).values(row))
    return str(row["id"])


def listed(client: TestClient) -> dict[str, Any]:
    response = client.get(f"/api/recoverability/groups/{EXCEPTION_TYPE_AND_STACK_TRACE}")
    assert response.status_code == 200
    assert response.headers["Total-Count"] == str(len(response.json()))
    return {group["id"]: group for group in response.json()}


def operation(group: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in group.items() if key.startswith(("operation_", "need_"))}


def test_groups_without_a_retry_are_idle(client: TestClient, attempts: Attempts) -> None:
    for group in listed(client).values():
        assert operation(group) == IDLE


def test_preparing_then_forwarding(
    client: TestClient, engine: sa.Engine, timeout_group: tuple[str, str, int]
) -> None:
    group_id, title, _ = timeout_group
    operation_id = record_retry(engine, group_id, title)
    preparing = operation(listed(client)[group_id])
    assert preparing["operation_status"] == "Preparing"
    assert preparing["operation_progress"] == 0.0
    assert utc(preparing["operation_start_time"]) == STARTED
    assert preparing["need_user_acknowledgement"] is False

    with engine.begin() as conn:
        conn.execute(
            sa.update(retry_operations)
            .where(retry_operations.c.id == operation_id)
            .values(prepared_at=STARTED, forwarded_count=1, skipped_count=1, failed=True)
        )
    forwarding = operation(client.get(f"/api/recoverability/groups/id/{group_id}").json())
    assert forwarding == {
        "operation_status": "Forwarding",
        "operation_failed": True,
        "operation_progress": 0.5,
        "operation_remaining_count": 2,
        "operation_start_time": preparing["operation_start_time"],
        "need_user_acknowledgement": False,
    }


def test_completed_retry_awaits_acknowledgement(
    client: TestClient, engine: sa.Engine, timeout_group: tuple[str, str, int]
) -> None:
    group_id, title, count = timeout_group
    done = STARTED + timedelta(minutes=2)
    record_retry(engine, group_id, title, prepared_at=STARTED, forwarded_count=4, completed_at=done)

    group = listed(client)[group_id]
    assert group["count"] == count  # the messages are Unresolved again (failed again)
    assert group["operation_status"] == "Completed"
    assert group["operation_progress"] == 1.0
    assert group["need_user_acknowledgement"] is True
    assert utc(group["operation_completion_time"]) == done

    url = f"/api/recoverability/unacknowledgedgroups/{group_id}"
    assert client.delete(url).status_code == 200
    assert operation(listed(client)[group_id]) == IDLE
    assert client.delete(url).status_code == 404


def test_a_running_retry_is_shown_over_a_completed_one(
    client: TestClient, engine: sa.Engine, timeout_group: tuple[str, str, int]
) -> None:
    group_id, title, _ = timeout_group
    later = STARTED + timedelta(hours=1)
    record_retry(engine, group_id, title)  # still running...
    record_retry(engine, group_id, title, started_at=later, prepared_at=later, completed_at=later)
    assert listed(client)[group_id]["operation_status"] == "Preparing"


def test_a_group_retried_whole_stays_visible_until_acknowledged(
    client: TestClient, engine: sa.Engine, timeout_group: tuple[str, str, int]
) -> None:
    group_id, title, count = timeout_group
    response = client.post(f"/api/recoverability/groups/{group_id}/errors/retry")
    assert response.status_code == 202, response.text

    # Its messages are RetryIssued now: the group counts none, yet the retry shows.
    running = listed(client)[group_id]
    assert running["count"] == 0
    assert running["title"] == title
    assert running["operation_status"] in ("Preparing", "Forwarding")
    assert next(iter(listed(client))) == group_id  # shown first

    with engine.begin() as conn:
        conn.execute(
            sa.update(retry_operations)
            .where(retry_operations.c.target == group_id)
            .values(forwarded_count=count, completed_at=datetime.now(UTC))
        )
    closed = listed(client)[group_id]
    assert closed["count"] == count  # the messages it sent
    assert closed["need_user_acknowledgement"] is True
    assert client.delete(f"/api/recoverability/unacknowledgedgroups/{group_id}").status_code == 200
    assert group_id not in listed(client)


def test_a_group_retried_whole_keeps_its_failures_per_hour_and_growth(
    client: TestClient, engine: sa.Engine, writer: FailedMessageBatchWriter
) -> None:
    """Fresh-user pass (seventh): the group shown for its retry, with no Unresolved message
    left, lacked ``failures_per_hour`` and ``growth``, which the README gives every group
    (its failures stay counted whatever their messages' status)."""
    attempt = parse_failed_message(
        failed_headers("recent-1", endpoint="Sales", failed_at=datetime.now(UTC)),
        b"{}",
        max_body_size_to_store=102_400,
    )
    writer.write(IngestionBatch(attempts=[attempt], endpoints=list(attempt.endpoints)))
    [(group_id, before)] = listed(client).items()
    assert sum(before["failures_per_hour"]) == 1
    hourly = {key: before[key] for key in ("failures_per_hour", "growth")}

    assert client.post(f"/api/recoverability/groups/{group_id}/errors/retry").status_code == 202
    running = listed(client)[group_id]
    assert running["count"] == 0
    assert {key: running.get(key) for key in hourly} == hourly

    with engine.begin() as conn:
        conn.execute(
            sa.update(retry_operations)
            .where(retry_operations.c.target == group_id)
            .values(forwarded_count=1, completed_at=datetime.now(UTC))
        )
    closed = listed(client)[group_id]
    assert closed["need_user_acknowledgement"] is True
    assert {key: closed.get(key) for key in hourly} == hourly
    one = client.get(f"/api/recoverability/groups/id/{group_id}").json()
    assert {key: one.get(key) for key in hourly} == hourly


def test_archived_views_show_no_retry(
    client: TestClient, engine: sa.Engine, timeout_group: tuple[str, str, int]
) -> None:
    group_id, title, _ = timeout_group
    record_retry(engine, group_id, title, prepared_at=STARTED, completed_at=STARTED)
    client.post(f"/api/recoverability/groups/{group_id}/errors/archive")
    archived = client.get(f"/api/archive/groups/id/{group_id}").json()
    assert operation(archived) == IDLE


def test_acknowledging_an_unknown_or_non_uuid_group(client: TestClient) -> None:
    unknown = "00000000-0000-4000-8000-000000000000"
    assert client.delete(f"/api/recoverability/unacknowledgedgroups/{unknown}").status_code == 404
    assert client.delete("/api/recoverability/unacknowledgedgroups/nope").status_code == 422
