"""Known endpoints on every provider: paged list, the user's ``monitored`` flag (which
ingestion never overrides), deletion, and ``/api/endpoints`` of an empty store
(test_parity_routes.py covers it with endpoints)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.db.tables import known_endpoints
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from tests.factories import at, endpoint
from tests.nsb import failed_headers

UNKNOWN = "00000000-0000-4000-8000-000000000000"


def known(client: TestClient, **params: Any) -> Any:
    response = client.get("/api/endpoints/known", params=params)
    assert response.status_code == 200, response.text
    return response


def ingest_sales_failure(writer: FailedMessageBatchWriter, message_id: str, seconds: float) -> str:
    """Ingest one failure of endpoint Sales; returns the Sales instance's known id."""
    attempt = parse_failed_message(
        failed_headers(message_id, endpoint="Sales", failed_at=at(seconds)),
        b"{}",
        max_body_size_to_store=1024,
    )
    writer.write(IngestionBatch(attempts=[attempt], endpoints=list(attempt.endpoints)))
    return next(e.id for e in attempt.endpoints if e.name == "Sales")


def test_known_endpoints_are_paged(client: TestClient, writer: FailedMessageBatchWriter) -> None:
    names = [f"Endpoint{n:03d}" for n in range(120)]
    writer.write(IngestionBatch(endpoints=[endpoint(name) for name in names]))

    first = known(client, per_page=50)
    assert first.headers["Total-Count"] == "120"
    assert 'rel="next"' in first.headers["Link"]
    assert "endpoints/known?" in first.headers["Link"]
    pages = [first.json()] + [known(client, per_page=50, page=n).json() for n in (2, 3)]
    assert [item["endpoint_details"]["name"] for page in pages for item in page] == names
    assert [len(page) for page in pages] == [50, 50, 20]
    item = pages[0][0]
    assert set(item) == {"id", "endpoint_details", "host_display_name", "monitored"}
    assert item["endpoint_details"] == {"name": "Endpoint000", "host_id": "0" * 32, "host": "h"}
    assert item["monitored"] is False


def test_known_endpoints_from_ingestion(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    sales_id = ingest_sales_failure(writer, "m1", 0)
    names = {item["endpoint_details"]["name"]: item for item in known(client).json()}
    assert set(names) == {"Sales", "WebShop"}  # receiving and sending endpoints
    assert names["Sales"]["id"] == sales_id


def test_monitored_survives_a_later_ingestion(
    client: TestClient, engine: sa.Engine, writer: FailedMessageBatchWriter
) -> None:
    sales_id = ingest_sales_failure(writer, "m1", 0)
    response = client.patch(f"/api/endpoints/{sales_id}", json={"monitoring_enabled": True})
    assert response.status_code == 202

    ingest_sales_failure(writer, "m2", 10)  # the same endpoint, written again
    writer.write(IngestionBatch(endpoints=sales_endpoints("m3")))  # and on its own

    by_id = {item["id"]: item for item in known(client).json()}
    assert by_id[sales_id]["monitored"] is True
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(known_endpoints.c.monitored).where(known_endpoints.c.id == sales_id)
        ).all()
    assert [row.monitored for row in rows] == [True]

    client.patch(f"/api/endpoints/{sales_id}", json={"monitoring_enabled": False})
    ingest_sales_failure(writer, "m4", 20)
    assert {item["id"]: item for item in known(client).json()}[sales_id]["monitored"] is False


def sales_endpoints(message_id: str) -> list[Any]:
    attempt = parse_failed_message(
        failed_headers(message_id, endpoint="Sales"), b"{}", max_body_size_to_store=1024
    )
    return list(attempt.endpoints)


def test_patch_needs_a_known_endpoint_and_a_boolean(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    response = client.patch(f"/api/endpoints/{UNKNOWN}", json={"monitoring_enabled": True})
    assert response.status_code == 404
    sales_id = ingest_sales_failure(writer, "m1", 0)
    for body in ({}, {"monitoring_enabled": "maybe"}, {"monitored": True}):
        response = client.patch(f"/api/endpoints/{sales_id}", json=body)
        assert response.status_code == 422, body
    assert client.patch("/api/endpoints/nope", json={"monitoring_enabled": True}).status_code == (
        422
    )


def test_delete_forgets_the_endpoint_until_it_fails_again(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    sales_id = ingest_sales_failure(writer, "m1", 0)
    client.patch(f"/api/endpoints/{sales_id}", json={"monitoring_enabled": True})

    assert client.delete(f"/api/endpoints/{sales_id}").status_code == 204
    assert sales_id not in {item["id"] for item in known(client).json()}
    assert client.delete(f"/api/endpoints/{sales_id}").status_code == 404
    assert client.get("/api/errors").headers["Total-Count"] == "1"  # its failure stays

    ingest_sales_failure(writer, "m2", 10)
    again = {item["id"]: item for item in known(client).json()}
    assert again[sales_id]["monitored"] is False


def test_endpoints_of_an_empty_store_is_an_empty_list(client: TestClient) -> None:
    response = client.get("/api/endpoints")
    assert response.status_code == 200
    assert response.json() == []
    assert response.headers["Total-Count"] == "0"
