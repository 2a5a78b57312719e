"""``/api/errors/counts``, ``/api/errors/last/{id}`` and ``/api/errors/queues/addresses``
on every provider: shapes, counts, paging, errors."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.db.tables import failed_messages
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from tests.factories import at, attempt, message_uuid
from tests.nsb import failed_headers


# --- summary ------------------------------------------------------------------------------
def test_summary_counts_every_status(
    client: TestClient, engine: sa.Engine, writer: FailedMessageBatchWriter
) -> None:
    writer.write(IngestionBatch(attempts=[attempt(n, at(n)) for n in range(6)]))
    with engine.begin() as conn:
        for n, status in ((0, 2), (1, 4), (2, 4)):
            conn.execute(
                sa.update(failed_messages)
                .where(failed_messages.c.id == message_uuid(n))
                .values(status=status)
            )

    response = client.get("/api/errors/counts")

    assert response.status_code == 200
    assert response.json() == {"unresolved": 3, "resolved": 1, "retryIssued": 0, "archived": 2}
    assert client.get("/api/errors/counts/").json() == response.json()


def test_summary_of_an_empty_store_is_all_zero(client: TestClient) -> None:
    assert client.get("/api/errors/counts").json() == {
        "unresolved": 0,
        "resolved": 0,
        "retryIssued": 0,
        "archived": 0,
    }


# --- last ---------------------------------------------------------------------------------
def test_last_is_the_list_item_plus_edited(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    writer.write(IngestionBatch(attempts=[attempt(n, at(n)) for n in range(3)]))
    [listed] = [item for item in client.get("/api/errors").json() if item["id"] == message_uuid(1)]

    response = client.get(f"/api/errors/last/{message_uuid(1)}")

    assert response.status_code == 200
    assert response.json() == {**listed, "edited": False, "edit_of": ""}


def test_last_of_an_edited_copy_names_the_original(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    original = str(uuid.uuid4())
    headers = failed_headers("edited-copy") | {"ServiceControl.EditOf": original}
    edited = parse_failed_message(headers, b"{}", max_body_size_to_store=1000)
    writer.write(IngestionBatch(attempts=[edited]))

    body = client.get(f"/api/errors/last/{edited.unique_message_id}/").json()

    assert body["edited"] is True
    assert body["edit_of"] == original
    assert body["time_of_failure"].endswith("Z") and body["last_modified"].endswith("Z")


def test_last_of_an_unknown_id_is_404(client: TestClient) -> None:
    assert client.get(f"/api/errors/last/{uuid.uuid4()}").status_code == 404


@pytest.mark.parametrize("path", ["/api/errors/last/nope", "/api/errors/last/12345"])
def test_last_of_a_non_uuid_is_422_naming_id(client: TestClient, path: str) -> None:
    response = client.get(path)

    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["path", "id"]


# --- queue addresses ----------------------------------------------------------------------
@pytest.fixture
def three_queues(engine: sa.Engine, writer: FailedMessageBatchWriter) -> None:
    """Queue "Billing" with 3 messages (one archived), "Sales" 2, "Shipping" 1."""
    queues = ["Billing"] * 3 + ["Sales"] * 2 + ["Shipping"]
    writer.write(
        IngestionBatch(
            attempts=[attempt(n, at(n), endpoint=queue) for n, queue in enumerate(queues)]
        )
    )
    with engine.begin() as conn:
        conn.execute(
            sa.update(failed_messages)
            .where(failed_messages.c.id == message_uuid(0))
            .values(status=4)
        )


def test_queue_addresses_count_failed_messages_per_queue(
    client: TestClient, three_queues: None
) -> None:
    response = client.get("/api/errors/queues/addresses")

    assert response.status_code == 200
    assert response.headers["Total-Count"] == "3"
    assert response.json() == [
        {"physical_address": "Billing", "failed_message_count": 3},
        {"physical_address": "Sales", "failed_message_count": 2},
        {"physical_address": "Shipping", "failed_message_count": 1},
    ]


def test_queue_addresses_are_paged(client: TestClient, three_queues: None) -> None:
    first = client.get("/api/errors/queues/addresses", params={"per_page": 2})
    second = client.get("/api/errors/queues/addresses/", params={"per_page": 2, "page": 2})

    assert [item["physical_address"] for item in first.json()] == ["Billing", "Sales"]
    assert [item["physical_address"] for item in second.json()] == ["Shipping"]
    assert second.headers["Total-Count"] == "3"
    assert '<errors/queues/addresses?per_page=2&page=2>; rel="next"' in first.headers["Link"]
    assert first.headers["ETag"] != second.headers["ETag"]
    beyond = client.get("/api/errors/queues/addresses", params={"per_page": 2, "page": 3})
    assert beyond.json() == [] and beyond.headers["Total-Count"] == "3"


def test_queue_addresses_of_an_empty_store(client: TestClient) -> None:
    response = client.get("/api/errors/queues/addresses")

    assert response.json() == [] and response.headers["Total-Count"] == "0"


# --- OpenAPI ------------------------------------------------------------------------------
def test_openapi_describes_every_read_route_and_parameter(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]

    listing = paths["/api/errors"]
    assert set(listing) >= {"get", "head"}
    parameters = {p["name"]: p for p in listing["get"]["parameters"]}
    assert set(parameters) >= {
        "page",
        "per_page",
        "sort",
        "direction",
        "status",
        "modified",
        "queueaddress",
    }
    # Any sort value is accepted (unknown ones read as the default); the keys are listed.
    for key in (
        "id",
        "message_id",
        "message_type",
        "status",
        "time_sent",
        "modified",
        "time_of_failure",
        "time_of_retry_request",
    ):
        assert key in parameters["sort"]["description"]
    assert all(p.get("description") for p in parameters.values())
    assert set(listing["get"]["responses"]["200"]["headers"]) == {"Total-Count", "ETag", "Link"}
    for path in (
        "/api/endpoints/{endpointname}/errors",
        "/api/errors/summary",
        "/api/errors/queues/addresses",
        "/api/errors/last/{id}",
        "/api/errors/{id}",
        "/api/messages/{id}/body",
    ):
        assert "get" in paths[path], path
        assert "200" in paths[path]["get"]["responses"], path
    assert not any(path.endswith("/") for path in paths)  # the slash aliases stay hidden
