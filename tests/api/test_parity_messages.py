"""ServiceControl's message views over failed messages, on every provider:
``/api/messages``, ``/api/endpoints/{name}/messages``, the endpoint-scoped search,
``/api/conversations/{id}`` (ServiceControl's ``MessagesView`` shape, paged, sortable) and
``/api/errors/summary`` as ServiceControl's facets; the counts per status at
``/api/errors/counts``."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.model import FailedAttempt
from tests.factories import at
from tests.nsb import failed_headers
from tests.retries.conftest import set_status, store_failed

MESSAGE_KEYS = {
    "id",
    "message_id",
    "message_type",
    "conversation_id",
    "is_system_message",
    "status",
    "processed_at",
    "time_sent",
    "sending_endpoint",
    "receiving_endpoint",
    "body_url",
    "body_size",
    "headers",
    "processing_time",
    "critical_time",
    "delivery_time",
}


@pytest.fixture
def stored(
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    engine: sa.Engine,
) -> dict[str, FailedAttempt]:
    """Four failed messages: two Sales (one in conversation "c-1", one archived), one
    Billing in "c-1", and a system message (a control message) in Sales."""
    made = {}
    for n, (name, endpoint, conversation) in enumerate(
        [("s-1", "Sales", "c-1"), ("s-2", "Sales", "c-2"), ("b-1", "Billing", "c-1")]
    ):
        headers = failed_headers(name, endpoint=endpoint, failed_at=at(n * 10)) | {
            h.CONVERSATION_ID: conversation
        }
        made[name] = store_failed(settings, writer, body_store, headers, b'{"walrus": 1}')
    system = failed_headers("sys-1", endpoint="Sales", failed_at=at(40)) | {
        h.CONTROL_MESSAGE: "True",
        h.ENCLOSED_MESSAGE_TYPES: None,
    }
    made["sys-1"] = store_failed(settings, writer, body_store, system, b"")
    set_status(engine, made["s-2"].unique_message_id, FailedMessageStatus.ARCHIVED)
    return made


def ids(response: object) -> list[str]:
    assert response.status_code == 200, response.text  # type: ignore[attr-defined]
    return [item["message_id"] for item in response.json()]  # type: ignore[attr-defined]


def test_messages_lists_failed_messages_in_the_messages_view_shape(
    client: TestClient, stored: dict[str, FailedAttempt]
) -> None:
    response = client.get("/api/messages")

    assert sorted(ids(response)) == ["b-1", "s-1", "s-2"]
    assert response.headers["Total-Count"] == "3"  # no system messages by default
    for item in response.json():
        assert set(item) == MESSAGE_KEYS
    statuses = {item["message_id"]: item["status"] for item in response.json()}
    assert statuses == {"s-1": "failed", "s-2": "archivedFailure", "b-1": "failed"}


def test_messages_include_system_messages_when_asked(
    client: TestClient, stored: dict[str, FailedAttempt]
) -> None:
    response = client.get("/api/messages", params={"include_system_messages": "true"})
    assert "sys-1" in ids(response)
    assert response.headers["Total-Count"] == "4"


def test_messages_sort_by_processed_at(
    client: TestClient, stored: dict[str, FailedAttempt]
) -> None:
    ascending = client.get("/api/messages", params={"sort": "processed_at", "direction": "asc"})
    assert ids(ascending) == ["s-1", "s-2", "b-1"]
    paged = client.get(
        "/api/messages", params={"sort": "processed_at", "direction": "asc", "per_page": 2}
    )
    assert ids(paged) == ["s-1", "s-2"]
    assert 'rel="next"' in paged.headers["Link"]


def test_endpoint_messages_and_endpoint_search(
    client: TestClient, stored: dict[str, FailedAttempt]
) -> None:
    assert sorted(ids(client.get("/api/endpoints/Sales/messages"))) == ["s-1", "s-2"]
    found = client.get("/api/endpoints/Billing/messages/search/walrus")
    assert ids(found) == ["b-1"]
    assert found.headers["Total-Count"] == "1"
    assert ids(client.get("/api/endpoints/Billing/messages/search", params={"q": "walrus"})) == [
        "b-1"
    ]
    assert ids(client.get("/api/endpoints/Nobody/messages/search/walrus")) == []


def test_conversation_lists_its_failed_messages(
    client: TestClient, stored: dict[str, FailedAttempt]
) -> None:
    response = client.get("/api/conversations/c-1")
    assert sorted(ids(response)) == ["b-1", "s-1"]
    assert response.headers["Total-Count"] == "2"
    assert all(item["conversation_id"] == "c-1" for item in response.json())
    assert ids(client.get("/api/conversations/no-such-conversation")) == []


def test_errors_summary_is_service_controls_facets_over_unresolved(
    client: TestClient, stored: dict[str, FailedAttempt]
) -> None:
    response = client.get("/api/errors/summary")

    assert response.status_code == 200
    summary = response.json()
    assert set(summary) == {"Endpoints", "Hosts", "Message types"}
    endpoints = summary["Endpoints"]
    assert endpoints["name"] == "Endpoints"
    # Unresolved only: s-1 and sys-1 in Sales, b-1 in Billing (s-2 is archived).
    assert endpoints["values"] == [
        {"range": "Sales", "count": 2},
        {"range": "Billing", "count": 1},
    ]
    assert summary["Hosts"]["values"] == [{"range": "MACHINENAME", "count": 3}]
    assert summary["Message types"]["values"] == [{"range": "Shop.Messages.PlaceOrder", "count": 2}]


def test_counts_per_status_have_a_route_of_their_own(
    client: TestClient, stored: dict[str, FailedAttempt]
) -> None:
    response = client.get("/api/errors/counts")
    assert response.status_code == 200
    assert response.json() == {"unresolved": 3, "resolved": 0, "retryIssued": 0, "archived": 1}
