"""The last answers that differed from ServiceControl's on its routes, on every provider
(docs/decisions.md "ServicePulse's requests are answered as ServiceControl answers
them"): the message views' timing fields, a keyword search that ORs its words, a retry of
an unknown id accepted as a no-op, an edit of an unknown id or without headers refused
with 400, and the event log answered with a trailing slash."""

from __future__ import annotations

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.model import FailedAttempt
from controlroom.transport.embedded import EmbeddedQueue
from tests.factories import at
from tests.nsb import failed_headers
from tests.retries.conftest import store_failed
from tests.retries.test_edit import editable, run_with_api

TIMINGS = ("processing_time", "critical_time", "delivery_time")


@pytest.fixture
def stored(
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> dict[str, FailedAttempt]:
    """Three failed messages of conversation "c-1": one says zarquon, one capacitor, one
    neither."""
    made = {}
    for n, (name, body) in enumerate(
        [("m-1", b"the zarquon is late"), ("m-2", b"flux capacitor broke"), ("m-3", b"other")]
    ):
        headers = failed_headers(name, endpoint="Sales", failed_at=at(n)) | {
            h.CONVERSATION_ID: "c-1",
            h.CONTENT_TYPE: "text/plain",
        }
        made[name] = store_failed(settings, writer, body_store, headers, body)
    return made


@pytest.mark.parametrize(
    "path", ["/api/messages", "/api/conversations/c-1", "/api/messages/search/zarquon"]
)
def test_message_views_carry_zero_timings_for_a_failed_message(
    client: TestClient, stored: dict[str, FailedAttempt], path: str
) -> None:
    response = client.get(path)

    assert response.status_code == 200, response.text
    assert response.json()
    for item in response.json():
        assert {key: item[key] for key in TIMINGS} == dict.fromkeys(TIMINGS, "00:00:00")


@pytest.mark.parametrize(
    "path",
    [
        "/api/messages/search/zarquon capacitor",
        "/api/messages/search?q=zarquon%20capacitor",
        "/api/endpoints/Sales/messages/search/zarquon capacitor",
    ],
)
def test_servicecontrol_searches_or_their_words(
    client: TestClient, stored: dict[str, FailedAttempt], path: str
) -> None:
    response = client.get(path)

    assert response.status_code == 200, response.text
    assert sorted(item["message_id"] for item in response.json()) == ["m-1", "m-2"]
    assert response.headers["Total-Count"] == "2"


def test_retry_of_an_unknown_id_is_accepted_and_does_nothing(
    client: TestClient, stored: dict[str, FailedAttempt]
) -> None:
    response = client.post("/api/errors/no-such-message/retry")

    assert response.status_code == 202, response.text
    assert response.json()["message_count"] == 0
    assert client.get("/api/recoverability/history").json()["unacknowledged_operations"] == []


def test_event_log_answers_with_a_trailing_slash(client: TestClient) -> None:
    response = client.get("/api/eventlogitems/", follow_redirects=False)

    assert response.status_code == 200
    assert response.json() == []


def test_edit_of_an_unknown_id_or_without_headers_is_a_400(
    settings: Settings,
    engine: sa.Engine,
    body_store: FileSystemBodyStore,
    stored: dict[str, FailedAttempt],
) -> None:
    known = stored["m-1"].unique_message_id

    async def scenario(api: httpx.AsyncClient, _: EmbeddedQueue) -> list[httpx.Response]:
        headers = editable(dict(stored["m-1"].headers))
        return [
            await api.post(
                "/api/edit/no-such-message",
                json={"message_body": "x", "message_headers": headers},
            ),
            await api.post(
                f"/api/edit/{known}", json={"message_body": "x", "message_headers": None}
            ),
        ]

    unknown, null_headers = run_with_api(settings, engine, body_store, scenario)

    assert unknown.status_code == 400, unknown.text
    assert null_headers.status_code == 400, null_headers.text
