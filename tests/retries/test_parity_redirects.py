"""ServiceControl's redirects API and a retry that honours a redirect (docs/decisions.md
"Redirects apply when a batch is staged"), on every
provider: the shapes and statuses of ``/api/redirects``, and a retried message of a
decommissioned queue arriving in the redirect's queue with the headers ServiceControl's
return-to-sender delivers."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.identity import deterministic_id
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.transport.embedded import EmbeddedQueue
from tests.nsb import failed_headers
from tests.retries.conftest import TIMEOUT, make_processor, statuses, store_failed, take
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.transport.helpers import Collector

REDIRECT_KEYS = {
    "message_redirect_id",
    "from_physical_address",
    "to_physical_address",
    "last_modified",
}


def test_redirects_crud_in_service_controls_shapes(client: TestClient) -> None:
    created = client.post(
        "/api/redirects",
        json={"fromphysicaladdress": "Sales@OLD", "tophysicaladdress": "Sales@NEW"},
    )
    assert created.status_code == 201
    listed = client.get("/api/redirects")
    assert listed.status_code == 200
    assert listed.headers["Total-Count"] == "1"
    (item,) = listed.json()
    assert set(item) == REDIRECT_KEYS
    assert item["message_redirect_id"] == deterministic_id("Sales@OLD")
    assert (item["from_physical_address"], item["to_physical_address"]) == (
        "Sales@OLD",
        "Sales@NEW",
    )
    assert client.head("/api/redirect").headers["Total-Count"] == "1"

    same_again = client.post(
        "/api/redirects",
        json={"fromphysicaladdress": "Sales@OLD", "tophysicaladdress": "Sales@NEW"},
    )
    assert same_again.status_code == 201
    elsewhere = client.post(
        "/api/redirects",
        json={"fromphysicaladdress": "Sales@OLD", "tophysicaladdress": "Sales@OTHER"},
    )
    assert elsewhere.status_code == 409
    assert elsewhere.json()["to_physical_address"] == "Sales@NEW"  # the existing one
    chained = client.post(
        "/api/redirects",
        json={"fromphysicaladdress": "Sales@NEW", "tophysicaladdress": "Sales@THIRD"},
    )
    assert chained.status_code == 409  # Sales@OLD depends on Sales@NEW
    assert [d["from_physical_address"] for d in chained.json()] == ["Sales@OLD"]
    blank = client.post("/api/redirects", json={"fromphysicaladdress": " "})
    assert blank.status_code == 400

    redirect_id = item["message_redirect_id"]
    assert (
        client.put(f"/api/redirects/{redirect_id}", json={"tophysicaladdress": ""}).status_code
        == 400
    )
    moved = client.put(f"/api/redirects/{redirect_id}", json={"tophysicaladdress": "Sales@NEWER"})
    assert moved.status_code == 204
    assert client.get("/api/redirects").json()[0]["to_physical_address"] == "Sales@NEWER"
    unknown = deterministic_id("nowhere")
    assert (
        client.put(f"/api/redirects/{unknown}", json={"tophysicaladdress": "x"}).status_code == 404
    )

    assert client.delete(f"/api/redirects/{redirect_id}").status_code == 204
    # Gone now: ServiceControl's DeleteRedirect answers NoContent for an unknown id too.
    assert client.delete(f"/api/redirects/{redirect_id}").status_code == 204
    assert client.delete(f"/api/redirects/{unknown}").status_code == 204
    assert client.get("/api/redirects").headers["Total-Count"] == "0"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"fromphysicaladdress": "q" * 1000, "tophysicaladdress": "Sales"}, "fromphysicaladdress"),
        ({"fromphysicaladdress": "Sales", "tophysicaladdress": "q" * 1000}, "tophysicaladdress"),
        # No queue is named by more than 255 bytes: a retry could never go there.
        ({"fromphysicaladdress": "Sales", "tophysicaladdress": "é" * 128}, "tophysicaladdress"),
    ],
)
def test_an_address_too_long_to_keep_or_to_send_to_is_refused_naming_it(
    client: TestClient, body: dict[str, str], field: str
) -> None:
    """Breaker, session 33: 1,000 characters answered the database's refusal with no field
    named; 300 were kept as a redirect no retry could follow."""
    answer = client.post("/api/redirects", json=body)
    assert answer.status_code == 422, answer.text
    assert [error["loc"] for error in answer.json()["detail"]] == [["body", field]]
    assert client.get("/api/redirects").json() == []
    assert client.post(
        "/api/redirects", json={"fromphysicaladdress": "q" * 400, "tophysicaladdress": "é" * 127}
    ).status_code == 201  # the bounds themselves are kept


def test_redirects_are_sorted_and_paged(client: TestClient) -> None:
    for n in range(3):
        client.post(
            "/api/redirects",
            json={"fromphysicaladdress": f"Q{n}", "tophysicaladdress": f"R{2 - n}"},
        )
    froms = [r["from_physical_address"] for r in client.get("/api/redirects").json()]
    assert froms == ["Q2", "Q1", "Q0"]  # from_physical_address, desc by default
    tos = client.get("/api/redirects", params={"sort": "to_physical_address", "direction": "asc"})
    assert [r["to_physical_address"] for r in tos.json()] == ["R0", "R1", "R2"]
    page = client.get("/api/redirects", params={"per_page": 2, "page": 2, "sort": "bogus"})
    assert [r["from_physical_address"] for r in page.json()] == ["Q0"]
    assert 'rel="first"' in page.headers["Link"]


def test_a_retry_honours_the_redirect_of_its_queue(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    failed = store_failed(
        settings, writer, body_store, failed_headers("order-9", endpoint="Sales"), b"{}"
    )
    client = TestClient(create_app(settings, engine, body_store))
    created = client.post(
        "/api/redirects",
        json={"fromphysicaladdress": "Sales", "tophysicaladdress": "Sales.V2@HOST"},
    )
    assert created.status_code == 201
    assert client.post(f"/api/errors/{failed.unique_message_id}/retry").status_code == 202

    async def forward() -> dict[str, str | None]:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            async with Collector(transport, "Sales.V2", prefetch=5) as collector:
                processor = make_processor(settings, engine, transport, body_store)
                async with asyncio.timeout(TIMEOUT):
                    assert await processor.process_pending() == 1
                    (delivery,) = await take(collector, 1)
                await processor.close()
            return dict(delivery.headers)

    sent = asyncio.run(forward())

    assert sent["ServiceControl.Retry.UniqueMessageId"] == failed.unique_message_id
    assert sent["ServiceControl.Retry.AcknowledgementQueue"] == settings.error_queue
    assert "ServiceControl.TargetEndpointAddress" not in sent
    assert "ServiceControl.Retry.Attempt.MessageId" not in sent
    assert statuses(engine)[failed.unique_message_id] == FailedMessageStatus.RETRY_ISSUED


def test_an_edit_honours_the_redirect_and_a_retry_to_proxy_gets_the_target(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    headers = failed_headers("order-10", endpoint="Sales") | {
        "ServiceControl.RetryTo": "Proxy@HOST"
    }
    failed = store_failed(settings, writer, body_store, headers, b"{}")
    edited = {name: value for name, value in headers.items() if value is not None}

    async def edit() -> tuple[int, dict[str, str | None]]:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            app = create_app(settings, engine, body_store, transport=transport)
            api = httpx.AsyncClient(
                transport=httpx.ASGITransport(app),
                base_url="http://test",
                timeout=TEST_CLIENT_TIMEOUT,
            )
            async with api, Collector(transport, "Proxy", prefetch=5) as collector:
                async with asyncio.timeout(TIMEOUT):
                    created = await api.post(
                        "/api/redirects",
                        json={"fromphysicaladdress": "Sales", "tophysicaladdress": "Sales.V2"},
                    )
                    assert created.status_code == 201
                    answer = await api.post(
                        f"/api/edit/{failed.unique_message_id}",
                        json={"message_body": "{}", "message_headers": edited},
                    )
                    (delivery,) = await take(collector, 1)
            return answer.status_code, dict(delivery.headers)

    status, sent = asyncio.run(edit())

    assert status == 202
    # Through the proxy, which forwards to the redirect's queue.
    assert sent["ServiceControl.TargetEndpointAddress"] == "Sales.V2"
