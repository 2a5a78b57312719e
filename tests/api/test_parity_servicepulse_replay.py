"""The ServicePulse requests recorded as failing (docs/decisions.md "ServicePulse's requests
are answered as ServiceControl answers them"), replayed with their query
strings exactly as recorded, on every provider: every answer 2xx, with the fields
ServicePulse reads. (``GET /api/eventlogitems`` belongs to the event-log work.)"""

from __future__ import annotations

import gzip
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.grouping import EXCEPTION_TYPE_AND_STACK_TRACE
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.model import FailedAttempt
from tests.factories import at
from tests.nsb import failed_headers
from tests.retries.conftest import set_status, store_failed

# ServicePulse's deleted-messages views send the modified window with millisecond times.
MODIFIED = "2000-01-01T00:00:00.000Z...2999-12-31T23:59:59.999Z"
LIST_ITEM = {"id", "message_id", "status", "exception", "receiving_endpoint", "time_of_failure"}


@pytest.fixture
def stored(
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    engine: sa.Engine,
) -> dict[str, FailedAttempt]:
    made = {}
    for n, name in enumerate(("archived-1", "pending-1", "gzip-1")):
        headers = failed_headers(name, endpoint="Sales", failed_at=at(n)) | {
            h.CONVERSATION_ID: "conversation-1"
        }
        body = b'{"n": 1}'
        if name == "gzip-1":
            headers[h.CONTENT_ENCODING] = "gzip"
            body = gzip.compress(body, mtime=0)
        made[name] = store_failed(settings, writer, body_store, headers, body)
    set_status(engine, made["archived-1"].unique_message_id, FailedMessageStatus.ARCHIVED)
    set_status(engine, made["pending-1"].unique_message_id, FailedMessageStatus.RETRY_ISSUED)
    return made


def ok(client: TestClient, method: str, url: str, **options: Any) -> Any:
    response = client.request(method, url, **options)
    assert 200 <= response.status_code < 300, (
        f"{method} {url}: {response.status_code} {response.text}"
    )
    return response


def test_the_recorded_servicepulse_requests_all_succeed(
    client: TestClient, stored: dict[str, FailedAttempt]
) -> None:
    archived = stored["archived-1"]
    group_id = next(g.id for g in archived.groups if g.classifier == EXCEPTION_TYPE_AND_STACK_TRACE)

    # Deleted messages, and a group's deleted messages: an empty sort.
    deleted = ok(
        client,
        "GET",
        f"/api/errors?status=archived&page=1&per_page=50&sort=&direction=desc&modified={MODIFIED}",
    )
    assert [item["id"] for item in deleted.json()] == [archived.unique_message_id]
    assert set(deleted.json()[0]) >= LIST_ITEM
    assert deleted.headers["Total-Count"] == "1"
    in_group = ok(
        client,
        "GET",
        f"/api/recoverability/groups/{group_id}/errors?status=archived&page=1&per_page=50"
        f"&sort=&direction=desc&modified={MODIFIED}",
    )
    assert [item["id"] for item in in_group.json()] == [archived.unique_message_id]

    # Pending retries: sorted by the retry request, an empty queue address.
    pending = ok(
        client,
        "GET",
        "/api/errors?status=retryIssued&page=1&per_page=50&sort=time_of_retry_request"
        "&direction=desc&queueaddress=",
    )
    assert pending.headers["Total-Count"] == "1"
    assert pending.json()[0]["id"] == stored["pending-1"].unique_message_id

    # Dashboard and configuration cards.
    assert ok(client, "GET", "/api/configuration/remotes").json() == []
    assert ok(client, "GET", "/api/endpointssettings").json()[0]["track_instances"] is True
    assert ok(client, "GET", "/api/authentication/configuration").json()["enabled"] is False
    assert ok(client, "GET", "/api/license/details").json()["license_status"] == "Valid"
    conversation = ok(client, "GET", "/api/conversations/conversation-1").json()
    assert {item["message_id"] for item in conversation} == set(stored)

    # Pending-retry actions by queue and time window; restore by date range.
    window = {"queueaddress": "Sales", "from": "2000-01-01T00:00:00.000Z", "to": MODIFIED[-24:]}
    ok(client, "POST", "/api/pendingretries/queues/retry", json=window)
    ok(client, "PATCH", "/api/pendingretries/queues/resolve", json=window)
    restored = ok(client, "PATCH", f"/api/errors/{MODIFIED}/unarchive").json()
    assert restored["changed"] == 1

    # Redirects.
    ok(
        client,
        "POST",
        "/api/redirects",
        json={"fromphysicaladdress": "Sales", "tophysicaladdress": "Sales.V2"},
    )
    (redirect,) = ok(
        client, "GET", "/api/redirects?page=1&per_page=50&sort=from_physical_address&direction=asc"
    ).json()
    redirect_id = redirect["message_redirect_id"]
    ok(client, "PUT", f"/api/redirects/{redirect_id}", json={"tophysicaladdress": "Sales.V3"})
    ok(client, "DELETE", f"/api/redirects/{redirect_id}")

    # A compressed body, labelled so the browser decodes it.
    body = ok(client, "GET", f"/api/messages/{stored['gzip-1'].unique_message_id}/body")
    assert body.headers["content-encoding"] == "gzip"
    assert body.content == b'{"n": 1}'  # decoded by the client, as a browser does
