"""ServiceControl's pending-retry and range routes, on every provider:
``POST /api/pendingretries/queues/retry`` and ``PATCH /api/pendingretries/queues/resolve``
(by queue and time window), ``PATCH /api/pendingretries/resolve`` resolving a message that
was never retried, and ``PATCH /api/errors/{from}...{to}/unarchive``."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.model import FailedAttempt
from tests.factories import at
from tests.nsb import failed_headers
from tests.retries.conftest import claims, set_status, statuses, store_failed

WINDOW = {"from": "2025-01-01T00:00:00Z", "to": "2030-01-01T00:00:00Z"}


@pytest.fixture
def stored(
    settings: Settings, writer: FailedMessageBatchWriter, body_store: FileSystemBodyStore
) -> dict[str, FailedAttempt]:
    return {
        name: store_failed(
            settings, writer, body_store, failed_headers(name, endpoint=queue, failed_at=at(n))
        )
        for n, (name, queue) in enumerate([("s-1", "Sales"), ("s-2", "Sales"), ("b-1", "Billing")])
    }


def set_modified(engine: sa.Engine, unique_id: str, seconds: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.update(failed_messages)
            .where(failed_messages.c.id == unique_id)
            .values(last_modified=at(seconds))
        )


def test_pending_retries_of_a_queue_are_retried_again(
    client: TestClient, engine: sa.Engine, stored: dict[str, FailedAttempt]
) -> None:
    for attempt in stored.values():
        assert client.post(f"/api/errors/{attempt.unique_message_id}/retry").status_code == 202
    # The earlier batches were sent and never confirmed; claims of done batches remain.
    response = client.post(
        "/api/pendingretries/queues/retry", json={"queueaddress": "Sales"} | WINDOW
    )

    assert response.status_code == 202
    # Sales's two are held by their first (live) batches: skipped, not claimed twice.
    assert response.json()["message_count"] + response.json()["skipped_count"] == 2
    assert set(claims(engine)) == {a.unique_message_id for a in stored.values()}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"from": "2025-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "queueaddress"),
        ({"queueaddress": " ", **WINDOW}, "queueaddress"),
        ({"queueaddress": "Sales", "from": "yesterday", "to": "2026-01-01T00:00:00Z"}, "from"),
    ],
)
@pytest.mark.parametrize(
    ("method", "url"),
    [("POST", "/api/pendingretries/queues/retry"), ("PATCH", "/api/pendingretries/queues/resolve")],
)
def test_queue_window_routes_answer_400_naming_the_field(
    client: TestClient, body: dict[str, str], field: str, method: str, url: str
) -> None:
    response = client.request(method, url, json=body)
    assert response.status_code == 400
    assert field in response.json()["detail"]


def test_resolve_by_queue_and_window_resolves_pending_and_never_retried_messages(
    client: TestClient, engine: sa.Engine, stored: dict[str, FailedAttempt]
) -> None:
    s1, s2, b1 = (stored[name].unique_message_id for name in ("s-1", "s-2", "b-1"))
    assert client.post(f"/api/errors/{s1}/retry").status_code == 202  # pending retry
    set_modified(engine, s2, -3600)  # never retried, and outside the window below

    response = client.patch(
        "/api/pendingretries/queues/resolve",
        json={
            "queueaddress": "Sales",
            "from": "2025-12-31T23:30:00Z",
            "to": "2030-01-01T00:00:00Z",
        },
    )

    assert response.status_code == 202
    assert response.json()["changed"] == 1
    assert statuses(engine) == {
        s1: FailedMessageStatus.RESOLVED,
        s2: FailedMessageStatus.UNRESOLVED,  # outside the window
        b1: FailedMessageStatus.UNRESOLVED,  # another queue
    }
    assert s1 not in claims(engine)


def test_resolving_a_never_retried_unresolved_message_by_id_resolves_it(
    client: TestClient, engine: sa.Engine, stored: dict[str, FailedAttempt]
) -> None:
    unique_id = stored["s-1"].unique_message_id

    response = client.patch("/api/pendingretries/resolve", json={"uniquemessageids": [unique_id]})

    assert response.status_code == 202
    assert response.json() == {"changed": 1, "unchanged_ids": []}
    assert statuses(engine)[unique_id] == FailedMessageStatus.RESOLVED


def test_resolving_by_range_takes_unresolved_messages_too(
    client: TestClient, engine: sa.Engine, stored: dict[str, FailedAttempt]
) -> None:
    response = client.patch("/api/pendingretries/resolve", json=WINDOW)
    assert response.status_code == 202
    assert response.json()["changed"] == 3


def test_unarchive_by_date_range(
    client: TestClient, engine: sa.Engine, stored: dict[str, FailedAttempt]
) -> None:
    s1, s2, b1 = (stored[name].unique_message_id for name in ("s-1", "s-2", "b-1"))
    for unique_id, seconds in ((s1, 100), (s2, 5000)):
        set_status(engine, unique_id, FailedMessageStatus.ARCHIVED)
        set_modified(engine, unique_id, seconds)

    response = client.patch(
        "/api/errors/2026-01-01T00:00:00.000Z...2026-01-01T01:00:00.000Z/unarchive"
    )

    assert response.status_code == 202
    assert response.json()["changed"] == 1
    assert statuses(engine) == {
        s1: FailedMessageStatus.UNRESOLVED,
        s2: FailedMessageStatus.ARCHIVED,  # archived after the range
        b1: FailedMessageStatus.UNRESOLVED,
    }
    assert client.patch("/api/errors/not-a-range/unarchive").status_code == 400
