"""The failed-message read API on every provider: paging, shapes, statuses, bodies."""

from __future__ import annotations

import dataclasses
import gzip
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.bodies import FileSystemBodyStore, body_key
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import BodyPlacement, FailedAttempt
from tests.factories import at, attempt, message_uuid

HOST_ID = "7f787fc8e0611a3fab8a93c8767f6639"
ORIGINATING_HOST_ID = "daaf5ebc8d6a51b7b0dccdd8b15c3626"


def failed_headers(**overrides: str | None) -> dict[str, str | None]:
    """A v8 header set like ``tests/data`` samples (XML body), with ``overrides`` applied."""
    headers: dict[str, str | None] = {
        h.HOST_DISPLAY_NAME: "BILLING-VM01",
        h.HOST_ID: HOST_ID,
        h.ORIGINATING_HOST_ID: ORIGINATING_HOST_ID,
        h.CONTENT_TYPE: "text/xml",
        h.CONVERSATION_ID: "1df93f45-324e-43b4-88c5-b33b000cea14",
        h.ENCLOSED_MESSAGE_TYPES: "Billing.Messages.ChargeCreditCard, Billing.Messages, "
        "Version=1.0.0.0, Culture=neutral, PublicKeyToken=null",
        h.EXCEPTION_TYPE: "System.Exception",
        "NServiceBus.ExceptionInfo.HelpLink": None,
        h.EXCEPTION_MESSAGE: "The exception message from the handler.",
        h.EXCEPTION_SOURCE: "Billing",
        h.EXCEPTION_STACK_TRACE: "System.Exception: The exception message from the handler.\n"
        "   at Billing.ChargeCreditCardHandler.Handle(ChargeCreditCard message, "
        "IMessageHandlerContext context)\n"
        "   at NServiceBus.InvokeHandlerTerminator.Terminate(IInvokeHandlerContext context)",
        h.FAILED_Q: "Billing@BILLING-VM01",
        h.MESSAGE_ID: "3a70adf2-2ade-430b-a91b-b33b000cea13",
        h.MESSAGE_INTENT: "Send",
        h.ORIGINATING_ENDPOINT: "Sales",
        h.ORIGINATING_MACHINE: "SALES-VM01",
        h.PROCESSING_ENDPOINT: "Billing",
        h.PROCESSING_MACHINE: "BILLING-VM01",
        h.REPLY_TO_ADDRESS: "Sales@SALES-VM01",
        h.TIME_OF_FAILURE: "2025-08-16 00:47:01:230083 Z",
        h.TIME_SENT: "2025-08-16 00:47:01:191801 Z",
        "NServiceBus.Version": "8.2.5",
    }
    headers.update(overrides)
    return headers


def parsed(settings: Settings, body: bytes, **overrides: str | None) -> FailedAttempt:
    return parse_failed_message(
        failed_headers(**overrides), body, max_body_size_to_store=settings.max_body_size_to_store
    )


def store(
    writer: FailedMessageBatchWriter, body_store: FileSystemBodyStore, *attempts: FailedAttempt
) -> None:
    """Ingest ``attempts`` as ingestion does: external bodies first, then one batch."""
    for item in attempts:
        if item.body_key is not None:
            body_store.put(item.body_key, item.body)
    writer.write(IngestionBatch(attempts=list(attempts)))


def ids(response: Any) -> list[str]:
    return [item["id"] for item in response.json()]


# --- GET /api/errors ----------------------------------------------------------------------
def test_list_is_paged_newest_first_with_total_count(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    writer.write(IngestionBatch(attempts=[attempt(n, at(n)) for n in range(7)]))

    first = client.get("/api/errors", params={"per_page": 3})
    assert first.status_code == 200
    assert first.headers["Total-Count"] == "7"
    assert ids(first) == [message_uuid(n) for n in (6, 5, 4)]
    third = client.get("/api/errors", params={"per_page": 3, "page": 3})
    assert ids(third) == [message_uuid(0)]
    assert third.headers["Total-Count"] == "7"
    beyond = client.get("/api/errors", params={"per_page": 3, "page": 4})
    assert beyond.json() == [] and beyond.headers["Total-Count"] == "7"
    assert "Link" not in beyond.headers


def test_list_link_header_follows_servicecontrol(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    writer.write(IngestionBatch(attempts=[attempt(n, at(n)) for n in range(7)]))

    middle = client.get("/api/errors", params={"per_page": 3, "page": 2})

    assert middle.headers["Link"] == (
        '<errors?per_page=3&page=1>; rel="first", <errors?per_page=3&page=1>; rel="prev", '
        '<errors?per_page=3&page=3>; rel="last", <errors?per_page=3&page=3>; rel="next"'
    )
    one_page = client.get("/api/errors")
    assert "Link" not in one_page.headers


def test_list_defaults_to_50_and_reads_a_page_below_1_as_1(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    writer.write(IngestionBatch(attempts=[attempt(n, at(n)) for n in range(55)]))
    newest_first = [message_uuid(n) for n in range(54, 4, -1)]

    assert ids(client.get("/api/errors")) == newest_first
    assert ids(client.get("/api/errors", params={"page": 0})) == newest_first
    assert ids(client.get("/api/errors", params={"page": -3})) == newest_first
    assert ids(client.get("/api/errors", params={"per_page": 0})) == newest_first


def test_list_caps_per_page_at_500(client: TestClient, writer: FailedMessageBatchWriter) -> None:
    writer.write(IngestionBatch(attempts=[attempt(n, at(n)) for n in range(501)]))

    response = client.get("/api/errors", params={"per_page": 5000})

    assert len(response.json()) == 500
    assert response.headers["Total-Count"] == "501"
    assert '<errors?per_page=500&page=2>; rel="next"' in response.headers["Link"]


@pytest.mark.parametrize("name", ["page", "per_page"])
def test_list_refuses_a_non_integer_paging_parameter_naming_it(
    client: TestClient, name: str
) -> None:
    response = client.get("/api/errors", params={name: "two"})

    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", name]


def test_list_item_has_servicecontrol_shape(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    failure = parsed(settings, b"<ChargeCreditCard />")
    store(writer, body_store, failure)

    [item] = client.get("/api/errors").json()

    assert item == {
        "id": failure.unique_message_id,
        "message_id": "3a70adf2-2ade-430b-a91b-b33b000cea13",
        "message_type": "Billing.Messages.ChargeCreditCard",
        "time_sent": "2025-08-16T00:47:01.191801Z",
        "is_system_message": False,
        "exception": {
            "exception_type": "System.Exception",
            "message": "The exception message from the handler.",
            "source": "Billing",
            "stack_trace": failed_headers()[h.EXCEPTION_STACK_TRACE],
        },
        "number_of_processing_attempts": 1,
        "status": "unresolved",
        "sending_endpoint": {
            "name": "Sales",
            "host_id": str(uuid.UUID(ORIGINATING_HOST_ID)),
            "host": "SALES-VM01",
        },
        "receiving_endpoint": {
            "name": "Billing",
            "host_id": str(uuid.UUID(HOST_ID)),
            "host": "BILLING-VM01",
        },
        "queue_address": "Billing@BILLING-VM01",
        "time_of_failure": "2025-08-16T00:47:01.230083Z",
        "last_modified": item["last_modified"],
    }
    assert item["last_modified"].endswith("Z")


def test_list_gives_no_sending_endpoint_when_the_headers_name_none(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    failure = parsed(
        settings,
        b"<x />",
        **{h.ORIGINATING_ENDPOINT: None, h.ORIGINATING_ADDRESS: None, h.REPLY_TO_ADDRESS: None},
    )
    store(writer, body_store, failure)

    [item] = client.get("/api/errors").json()

    assert "sending_endpoint" not in item  # nulls are left out, as ServiceControl does


def test_times_before_the_year_1000_are_iso_8601_with_four_year_digits(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    # .NET's DateTime.MinValue (0001-01-01) is what a producer sends for a time it never
    # set; strftime's %Y writes the year 1 as "1", which no ISO 8601 parser reads.
    failure = parsed(
        settings,
        b"<x />",
        **{
            h.TIME_SENT: "0001-01-01 00:00:00:000000 Z",
            h.TIME_OF_FAILURE: "0999-12-31 23:59:59:999999 Z",
        },
    )
    store(writer, body_store, failure)

    [item] = client.get("/api/errors").json()
    [group] = client.get("/api/recoverability/groups").json()

    assert item["time_sent"] == "0001-01-01T00:00:00.000000Z"
    assert item["time_of_failure"] == "0999-12-31T23:59:59.999999Z"
    assert group["first"] == group["last"] == "0999-12-31T23:59:59.999999Z"


def test_list_names_every_status_in_camel_case(
    client: TestClient, engine: sa.Engine, writer: FailedMessageBatchWriter
) -> None:
    writer.write(IngestionBatch(attempts=[attempt(n, at(n)) for n in range(4)]))
    with engine.begin() as conn:
        for n, status in enumerate(FailedMessageStatus):
            conn.execute(
                sa.update(failed_messages)
                .where(failed_messages.c.id == message_uuid(n))
                .values(status=int(status))
            )

    statuses = {item["id"]: item["status"] for item in client.get("/api/errors").json()}

    assert statuses == {
        message_uuid(0): "unresolved",
        message_uuid(1): "resolved",
        message_uuid(2): "retryIssued",
        message_uuid(3): "archived",
    }


# --- GET /api/errors/{id} -----------------------------------------------------------------
def test_detail_has_headers_window_groups_and_body_reference(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    first = parsed(settings, b"<ChargeCreditCard />")
    again = parsed(
        settings, b"<ChargeCreditCard />", **{h.TIME_OF_FAILURE: "2025-08-16 01:00:00:5 Z"}
    )
    store(writer, body_store, first, again)

    response = client.get(f"/api/errors/{first.unique_message_id}")

    assert response.status_code == 200
    detail = response.json()
    assert detail["id"] == first.unique_message_id
    assert detail["headers"] == dict(again.headers)
    assert detail["number_of_processing_attempts"] == 2
    assert detail["first_failure_at"] == "2025-08-16T00:47:01.230083Z"
    assert detail["last_failure_at"] == "2025-08-16T01:00:00.500000Z"
    assert detail["time_of_failure"] == detail["last_failure_at"]
    assert detail["body_url"] == f"/messages/{first.unique_message_id}/body"  # from /api/
    assert detail["body_size"] == len(b"<ChargeCreditCard />")
    assert detail["content_type"] == "text/xml"
    assert sorted((g["type"], g["title"], g["id"]) for g in detail["groups"]) == sorted(
        (g.classifier, g.title, g.id) for g in again.groups
    )
    assert {g["type"] for g in detail["groups"]} >= {"Message Type", "Endpoint Name"}


def test_detail_accepts_an_upper_case_id(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    writer.write(IngestionBatch(attempts=[attempt(1, at(1))]))

    response = client.get(f"/api/errors/{message_uuid(1).upper()}")

    assert response.status_code == 200
    assert response.json()["id"] == message_uuid(1)


def test_detail_of_an_unknown_id_is_404(client: TestClient) -> None:
    unknown = uuid.uuid4()

    response = client.get(f"/api/errors/{unknown}")

    assert response.status_code == 404
    assert str(unknown) in response.json()["detail"]


def test_a_non_uuid_id_is_422_naming_the_parameter(client: TestClient) -> None:
    # /messages/{id}/body also takes a native message id (test_parity_bodies.py).
    response = client.get("/api/errors/not-a-uuid")

    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["path", "id"]


# --- GET /api/messages/{id}/body ----------------------------------------------------------
def body_of(client: TestClient, failure: FailedAttempt) -> Any:
    return client.get(f"/api/messages/{failure.unique_message_id}/body")


def test_body_inline_text_is_the_exact_bytes_with_the_original_type(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    body = "<Note>Grüße, café ✓</Note>\r\n".encode()
    failure = parsed(settings, body)
    assert not failure.body_placement.external
    store(writer, body_store, failure)

    response = body_of(client, failure)

    assert response.status_code == 200
    assert response.content == body
    assert response.headers["content-type"] == "text/xml"  # no charset added


def test_body_external_binary_is_the_exact_bytes(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    body = b"%PDF-1.7\n\x00\xff\xfe" + bytes(range(256)) * 40
    failure = parsed(settings, body, **{h.CONTENT_TYPE: "application/octet-stream"})
    assert failure.body_placement == BodyPlacement(size=len(body), text=None, external=True)
    store(writer, body_store, failure)

    response = body_of(client, failure)

    assert response.status_code == 200
    assert response.content == body
    assert response.headers["content-type"] == "application/octet-stream"


def test_body_gzip_encoded_is_served_still_encoded(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    body = gzip.compress(b'{"OrderId":"ORD-1"}', mtime=0)
    failure = parsed(
        settings, body, **{h.CONTENT_TYPE: "application/json", h.CONTENT_ENCODING: "gzip"}
    )
    store(writer, body_store, failure)

    with client.stream("GET", f"/api/messages/{failure.unique_message_id}/body") as response:
        raw = b"".join(response.iter_raw())

    # The bytes as they were queued, labelled so that a client decodes them
    # (docs/decisions.md "Bodies are served as they were queued").
    assert response.headers["content-encoding"] == "gzip"
    assert raw == body


def test_body_over_the_cap_is_the_whole_external_copy_not_the_prefix(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    body = ("<Lines>" + "<Line>Grüße</Line>" * 8000 + "</Lines>").encode()
    failure = parsed(settings, body)
    assert failure.body_placement.external and failure.body_placement.text
    store(writer, body_store, failure)

    response = body_of(client, failure)

    assert response.content == body
    assert len(response.content) > settings.max_body_size_to_store


def test_body_external_copy_is_authoritative_over_inline_text(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    body = b"<ChargeCreditCard>the external copy</ChargeCreditCard>"
    failure = parsed(settings, body)
    both = dataclasses.replace(
        failure,
        body_placement=BodyPlacement(size=len(body), text="stale inline text", external=True),
        body_key=body_key(failure.unique_message_id, body),
    )
    store(writer, body_store, both)

    response = body_of(client, both)

    assert response.content == body


def test_body_of_an_unknown_message_is_404(client: TestClient) -> None:
    response = client.get(f"/api/messages/{uuid.uuid4()}/body")

    assert response.status_code == 404


def test_body_missing_from_the_store_is_404_not_the_inline_prefix(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
) -> None:
    failure = parsed(settings, b"\x00binary", **{h.CONTENT_TYPE: "application/octet-stream"})
    writer.write(IngestionBatch(attempts=[failure]))  # the body store never got it

    response = body_of(client, failure)

    assert response.status_code == 404
    assert "missing from the body store" in response.json()["detail"]
