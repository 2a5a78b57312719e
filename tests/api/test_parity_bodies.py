"""Bodies as ServiceControl serves them (docs/decisions.md "Bodies are served as they were
queued"), on every provider: a compressed body
with its ``Content-Encoding`` (byte-exact on the wire, decoded by a browser), an empty body
as 204, a body found by the native message id; and a minimal message (``FailedQ`` and
``MessageId`` only) stored and served as a failed message."""

from __future__ import annotations

import gzip
import json

import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from tests.nsb import failed_headers
from tests.retries.conftest import store_failed


def raw_body(client: TestClient, url: str) -> tuple[int, dict[str, str], bytes]:
    """The answer's status, headers and bytes exactly as sent (not content-decoded)."""
    with client.stream("GET", url) as response:
        return response.status_code, dict(response.headers), b"".join(response.iter_raw())


def test_a_gzip_body_is_served_with_its_content_encoding(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    original = b'{"OrderId": "ORD-1"}'
    body = gzip.compress(original, mtime=0)
    headers = failed_headers("gz-1") | {h.CONTENT_ENCODING: "gzip"}
    failure = store_failed(settings, writer, body_store, headers, body)

    status, sent, raw = raw_body(client, f"/api/messages/{failure.unique_message_id}/body")

    assert status == 200
    assert raw == body  # byte-exact on the wire
    assert sent["content-encoding"] == "gzip"
    assert sent["content-type"] == "application/json"
    # What a browser (any HTTP client honouring Content-Encoding) shows.
    decoded = client.get(f"/api/messages/{failure.unique_message_id}/body")
    assert decoded.content == original


def test_an_empty_body_is_204(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    failure = store_failed(settings, writer, body_store, failed_headers("empty-1"), b"")

    response = client.get(f"/api/messages/{failure.unique_message_id}/body")

    assert response.status_code == 204
    assert response.content == b""
    assert not list(settings.body_dir.rglob("*")) or all(
        p.is_dir() for p in settings.body_dir.rglob("*")
    )  # stored nowhere


def test_a_body_is_found_by_the_native_message_id(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    store_failed(settings, writer, body_store, failed_headers("native-7"), b'{"n": 7}')

    response = client.get("/api/messages/native-7/body")

    assert response.status_code == 200
    assert response.content == b'{"n": 7}'
    assert client.get("/api/messages/no-such-message/body").status_code == 404


def test_a_minimal_message_is_a_failed_message(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    engine: sa.Engine,
) -> None:
    minimal = {h.FAILED_Q: "Sales@MACHINE", h.MESSAGE_ID: "minimal-1"}
    failure = store_failed(settings, writer, body_store, minimal, b"\x01\x02")

    listed = client.get("/api/errors").json()
    detail = client.get(f"/api/errors/{failure.unique_message_id}").json()
    body = client.get(f"/api/messages/{failure.unique_message_id}/body")

    assert [item["id"] for item in listed] == [failure.unique_message_id]
    assert listed[0]["receiving_endpoint"]["name"] == "Sales"
    assert listed[0]["queue_address"] == "Sales@MACHINE"
    assert detail["headers"] == minimal
    assert body.content == b"\x01\x02"
    assert body.headers["content-type"] == "application/octet-stream"  # no type: binary
    groups = client.get("/api/recoverability/groups/Endpoint Name").json()
    assert [group["title"] for group in groups] == ["Sales"]
    assert json.loads(json.dumps(detail))  # plain JSON
