"""``GET /api/errors/{id}`` in ServiceControl's ``FailedMessage`` shape, on every
provider: ``unique_message_id``, ``status``, ``processing_attempts`` (the stored attempt
last, with ``failure_details``, ``headers`` and ``message_metadata``, and one entry per
counted attempt) and ``failure_groups``; the flat fields stay beside them."""

from __future__ import annotations

from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from tests.factories import at
from tests.nsb import failed_headers
from tests.retries.conftest import store_failed


def test_detail_has_service_controls_failed_message_shape(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    first = store_failed(
        settings, writer, body_store, failed_headers("order-1", failed_at=at(10)), b'{"a": 1}'
    )
    for seconds in (20, 30):
        last = store_failed(
            settings,
            writer,
            body_store,
            failed_headers("order-1", failed_at=at(seconds)),
            b'{"a": 1}',
        )

    response = client.get(f"/api/errors/{first.unique_message_id}")

    assert response.status_code == 200
    detail = response.json()
    assert detail["id"] == detail["unique_message_id"] == first.unique_message_id
    assert detail["status"] == "unresolved"
    assert detail["number_of_processing_attempts"] == 3  # the flat fields stay
    attempts = detail["processing_attempts"]
    assert len(attempts) == 3
    newest = attempts[-1]
    assert set(newest) == {
        "attempted_at",
        "message_id",
        "headers",
        "message_metadata",
        "failure_details",
    }
    assert newest["attempted_at"] == "2026-01-01T00:00:30.000000Z"
    assert newest["message_id"] == "order-1"
    assert newest["headers"] == {k: v for k, v in last.headers.items() if v is not None}
    assert newest["failure_details"] == {
        "address_of_failing_endpoint": "Sales",
        "time_of_failure": "2026-01-01T00:00:30.000000Z",
        "exception": {
            "exception_type": "System.InvalidOperationException",
            "message": "The order could not be placed.",
            "source": "Shop.Sales",
            "stack_trace": last.stack_trace,
        },
    }
    metadata = newest["message_metadata"]
    assert metadata["MessageId"] == "order-1"
    assert metadata["MessageType"] == "Shop.Messages.PlaceOrder"
    assert metadata["IsSystemMessage"] is False
    assert metadata["ContentType"] == "application/json"
    assert metadata["BodySize"] == len(b'{"a": 1}')
    assert metadata["BodyUrl"] == f"/messages/{first.unique_message_id}/body"
    assert metadata["ReceivingEndpoint"]["name"] == "Sales"
    assert metadata["SendingEndpoint"]["name"] == "WebShop"
    assert metadata["ConversationId"] == "be6afcc4-3295-4b6c-8d2f-b43b016c458b"
    assert metadata["TimeSent"] == "2025-12-31T23:59:59.000000Z"
    # The earlier attempts: counted, not stored; the first one's time is known.
    assert attempts[0] == {"attempted_at": "2026-01-01T00:00:10.000000Z", "message_id": "order-1"}
    assert attempts[1] == {"message_id": "order-1"}
    groups = detail["failure_groups"]
    assert [(g["id"], g["title"], g["type"]) for g in groups] == sorted(
        ((g.id, g.title, g.classifier) for g in last.groups), key=lambda g: (g[2], g[1])
    )
