"""Edit and retry on every provider, over the embedded queue: the edited body and headers
are sent, locked headers are refused with 400, the original ends Resolved
(docs/decisions.md "Edits lock the identity and retry headers")."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import sqlalchemy as sa

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.retries import wire as retry_wire
from controlroom.transport.embedded import EmbeddedQueue
from controlroom.transport.rabbitmq import RabbitMQTransport
from tests.nsb import failed_headers
from tests.retries.conftest import (
    TIMEOUT,
    claims,
    set_status,
    statuses,
    store_failed,
    take,
    unique_name,
)
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.transport.helpers import Collector

Scenario = Callable[[httpx.AsyncClient, EmbeddedQueue], Awaitable[Any]]


def editable(headers: dict[str, str | None]) -> dict[str, str | None]:
    """The headers as a client sends them back: without null values (a null is a 400)."""
    return {name: value for name, value in headers.items() if value is not None}


def run_with_api(
    settings: Settings,
    engine: sa.Engine,
    body_store: FileSystemBodyStore,
    scenario: Scenario,
    *,
    make_transport: Callable[[], Any] | None = None,
) -> Any:
    """Run ``scenario`` against the app, in one event loop with its transport (the edit
    route publishes on the app's transport): ``make_transport()``, by default the
    embedded queue."""

    def embedded() -> EmbeddedQueue:
        return EmbeddedQueue(settings.embedded_queue_path)

    async def main() -> Any:
        async with (make_transport or embedded)() as transport:
            app = create_app(settings, engine, body_store, transport=transport)
            api = httpx.AsyncClient(
                transport=httpx.ASGITransport(app),
                base_url="http://test",
                timeout=TEST_CLIENT_TIMEOUT,
            )
            async with api, asyncio.timeout(TIMEOUT):
                return await scenario(api, transport)

    return asyncio.run(main())


def test_edit_config_lists_locked_and_sensitive_headers(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    async def scenario(api: httpx.AsyncClient, _: EmbeddedQueue) -> httpx.Response:
        return await api.get("/api/edit/config")

    response = run_with_api(settings, engine, body_store, scenario)

    config = response.json()
    assert config["enabled"] is True
    assert {"NServiceBus.MessageId", "ServiceControl.Retry.UniqueMessageId"} <= set(
        config["locked_headers"]
    )
    assert "NServiceBus.ReplyToAddress" in config["sensitive_headers"]


def test_edit_sends_the_edited_copy_and_resolves_the_original(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    headers = failed_headers("order-1", endpoint="Sales")
    headers["ServiceControl.EditOf"] = str(uuid.uuid4())  # an edit of an edit: replaced
    original = store_failed(settings, writer, body_store, headers, b'{"qty": -1}')
    edited_headers = editable(headers) | {
        "NServiceBus.EnclosedMessageTypes": "Shop.Messages.PlaceOrderV2"
    }

    async def scenario(api: httpx.AsyncClient, transport: EmbeddedQueue) -> tuple[Any, Any]:
        response = await api.post(
            f"/api/edit/{original.unique_message_id}",
            json={"message_body": '{"qty": 1}', "message_headers": edited_headers},
        )
        async with Collector(transport, "Sales", prefetch=5) as collector:
            (delivery,) = await take(collector, 1)
        return response, delivery

    response, delivery = run_with_api(settings, engine, body_store, scenario)

    assert response.status_code == 202, response.text
    answer = response.json()
    assert delivery.body == b'{"qty": 1}'
    sent = dict(delivery.headers)
    assert sent["NServiceBus.EnclosedMessageTypes"] == "Shop.Messages.PlaceOrderV2"
    assert sent["NServiceBus.MessageId"] == answer["message_id"] != headers["NServiceBus.MessageId"]
    assert sent["ServiceControl.EditOf"] == original.unique_message_id
    assert sent["ServiceControl.Retry.UniqueMessageId"] == answer["edit_id"]
    assert sent["ServiceControl.Retry.AcknowledgementQueue"] == settings.error_queue
    assert "ServiceControl.TargetEndpointAddress" not in sent  # sent straight to Sales
    assert not [name for name in sent if name.startswith(retry_wire.STRIPPED_HEADER_PREFIXES[:4])]
    assert statuses(engine)[original.unique_message_id] == FailedMessageStatus.RESOLVED
    assert claims(engine) == {}


def test_edit_of_a_locked_header_is_refused_with_400_and_nothing_is_sent(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    headers = failed_headers("order-2", endpoint="Sales")
    original = store_failed(settings, writer, body_store, headers)
    attempts = [
        editable(headers) | {"NServiceBus.MessageId": "forged"},
        editable(headers) | {"NServiceBus.ConversationId": str(uuid.uuid4())},
        {k: v for k, v in editable(headers).items() if k != "NServiceBus.ConversationId"},
    ]

    async def scenario(api: httpx.AsyncClient, transport: EmbeddedQueue) -> list[httpx.Response]:
        answers = [
            await api.post(
                f"/api/edit/{original.unique_message_id}",
                json={"message_body": "{}", "message_headers": edited},
            )
            for edited in attempts
        ]
        empty_body = await api.post(
            f"/api/edit/{original.unique_message_id}",
            json={"message_body": "  ", "message_headers": editable(headers)},
        )
        assert await transport.purge("Sales") == 0
        return [*answers, empty_body]

    answers = run_with_api(settings, engine, body_store, scenario)

    assert [a.status_code for a in answers] == [400] * 4
    assert "NServiceBus.MessageId" in answers[0].json()["detail"]
    assert "NServiceBus.ConversationId" in answers[1].json()["detail"]
    assert "NServiceBus.ConversationId" in answers[2].json()["detail"]
    assert "message_body" in answers[3].json()["detail"]
    assert statuses(engine)[original.unique_message_id] == FailedMessageStatus.UNRESOLVED


def test_edit_of_unknown_or_archived_messages_is_refused_and_of_retrying_ignored(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    archived = store_failed(settings, writer, body_store, failed_headers("a")).unique_message_id
    retrying = store_failed(settings, writer, body_store, failed_headers("r")).unique_message_id
    set_status(engine, archived, FailedMessageStatus.ARCHIVED)

    async def scenario(api: httpx.AsyncClient, _: EmbeddedQueue) -> list[httpx.Response]:
        await api.post(f"/api/errors/{retrying}/retry")
        body = {"message_body": "{}", "message_headers": editable(failed_headers("a"))}
        return [
            await api.post(f"/api/edit/{target}", json=body)
            for target in (str(uuid.uuid4()), archived, retrying)
        ]

    unknown, of_archived, of_retrying = run_with_api(settings, engine, body_store, scenario)

    assert unknown.status_code == 400  # as ServiceControl answers an unknown id
    assert of_archived.status_code == 409 and "archived" in of_archived.json()["detail"]
    # ServiceControl ignores an edit while the message is taken.
    assert of_retrying.status_code == 200 and of_retrying.json() == {"edit_ignored": True}


def test_edit_without_a_transport_answers_503(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    original = store_failed(settings, writer, body_store, failed_headers("x"))
    app = create_app(settings, engine, body_store)

    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", timeout=TEST_CLIENT_TIMEOUT
        ) as api:
            return await api.post(
                f"/api/edit/{original.unique_message_id}",
                json={"message_body": "{}", "message_headers": editable(failed_headers("x"))},
            )

    assert asyncio.run(main()).status_code == 503
    assert statuses(engine)[original.unique_message_id] == FailedMessageStatus.UNRESOLVED


def test_a_repeated_edit_is_ignored_with_200(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    headers = failed_headers("order-3", endpoint="Sales")
    original = store_failed(settings, writer, body_store, headers)
    edit = {"message_body": '{"qty": 2}', "message_headers": editable(headers)}

    async def scenario(api: httpx.AsyncClient, transport: EmbeddedQueue) -> list[httpx.Response]:
        first = await api.post(f"/api/edit/{original.unique_message_id}", json=edit)
        again = await api.post(f"/api/edit/{original.unique_message_id}", json=edit)
        assert await transport.purge("Sales") == 1  # one copy sent, not two
        return [first, again]

    first, again = run_with_api(settings, engine, body_store, scenario)

    assert first.status_code == 202 and first.json()["edit_ignored"] is False
    assert again.status_code == 200
    assert again.json() == {"edit_ignored": True}


def test_a_null_header_value_is_400_naming_it(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    headers = failed_headers("order-4", endpoint="Sales")
    original = store_failed(settings, writer, body_store, headers)
    edited = editable(headers) | {"Custom.Header": None}

    async def scenario(api: httpx.AsyncClient, transport: EmbeddedQueue) -> httpx.Response:
        answer = await api.post(
            f"/api/edit/{original.unique_message_id}",
            json={"message_body": "{}", "message_headers": edited},
        )
        assert await transport.purge("Sales") == 0
        return answer

    answer = run_with_api(settings, engine, body_store, scenario)

    assert answer.status_code == 400
    assert "Custom.Header" in answer.json()["detail"]
    assert statuses(engine)[original.unique_message_id] == FailedMessageStatus.UNRESOLVED


def test_adding_a_locked_header_the_original_lacked_is_allowed(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    headers = editable(failed_headers("order-5", endpoint="Sales"))
    original = store_failed(settings, writer, body_store, headers)
    edited = headers | {"NServiceBus.CorrelationId": "added-by-the-operator"}

    async def scenario(api: httpx.AsyncClient, transport: EmbeddedQueue) -> Any:
        async with Collector(transport, "Sales", prefetch=5) as collector:
            answer = await api.post(
                f"/api/edit/{original.unique_message_id}",
                json={"message_body": "{}", "message_headers": edited},
            )
            (delivery,) = await take(collector, 1)
        return answer, delivery

    answer, delivery = run_with_api(settings, engine, body_store, scenario)

    assert answer.status_code == 202, answer.text
    assert delivery.headers["NServiceBus.CorrelationId"] == "added-by-the-operator"


def test_an_edit_with_headers_larger_than_a_frame_is_400_and_the_connection_stays(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    rabbitmq_url: str,
) -> None:
    """On RabbitMQ a header set larger than the negotiated frame_max closed the whole
    connection (503 "outcome unknown: FRAME_ERROR", every consumer on it dropped): the
    edit is refused with a 400 naming the problem, nothing is sent, the original stays
    Unresolved and a consumer on the same connection keeps receiving."""
    endpoint, other = unique_name("Sales"), unique_name("Other")
    headers = failed_headers("order-big", endpoint=endpoint)
    original = store_failed(settings, writer, body_store, headers)

    async def main() -> tuple[httpx.Response, list[bytes]]:
        async with RabbitMQTransport(rabbitmq_url) as transport, asyncio.timeout(TIMEOUT):
            app = create_app(settings, engine, body_store, transport=transport)
            api = httpx.AsyncClient(
                transport=httpx.ASGITransport(app),
                base_url="http://test",
                timeout=TEST_CLIENT_TIMEOUT,
            )
            async with api, Collector(transport, other, prefetch=5) as consumer:
                await transport.publish(other, {}, b"before")
                (before,) = await take(consumer, 1)
                response = await api.post(
                    f"/api/edit/{original.unique_message_id}",
                    json={
                        "message_body": "{}",
                        "message_headers": editable(headers) | {"X-Big": "b" * 200_000},
                    },
                )
                await transport.publish(other, {}, b"after")
                (after,) = await take(consumer, 1)
                assert await transport.purge(endpoint) == 0
            return response, [before.body, after.body]

    response, received = asyncio.run(main())

    assert response.status_code == 400, response.text
    assert "frame" in response.json()["detail"]
    assert received == [b"before", b"after"]
    assert statuses(engine)[original.unique_message_id] == FailedMessageStatus.UNRESOLVED
