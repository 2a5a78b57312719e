"""Retries of a Python task's failed message on every provider and both transports: the
task message goes back as its producer sent it (body bytes, broker properties, typed
header table) plus the retry headers; an edited copy keeps the properties; properties
that do not parse fail that message alone (docs/design.md "Python task queues")."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from controlroom import events
from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus, retry_operations
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.model import FailedAttempt
from controlroom.errors.retries import requests as retries
from controlroom.errors.retries import wire as retry_wire
from controlroom.integrations import envelope
from controlroom.transport.base import Delivery, Transport
from controlroom.transport.embedded import EmbeddedQueue
from controlroom.transport.rabbitmq import RabbitMQTransport
from tests.retries.conftest import (
    TIMEOUT,
    make_processor,
    statuses,
    store_failed,
    take,
    unique_name,
)
from tests.retries.test_edit import editable, run_with_api
from tests.transport.helpers import Collector

PICKLE_BODY = (
    b"\x80\x05\x95#\x00\x00\x00\x00\x00\x00\x00(K\x01]\x94(K\x02N\x85\x94}\x94}\x94t\x94.\xff\x00"
)

CELERY_TABLE: dict[str, Any] = {
    "lang": "py",
    "task": "shop.tasks.charge",
    "id": "",  # set per message
    "shadow": None,
    "eta": None,
    "retries": 3,
    "timelimit": [None, 30],
    "argsrepr": "(1, [2, None])",
    "ignore_result": False,
    "stamps": {},
    "blob": b"\x00\xff",
}


@pytest.fixture(params=["embedded", "rabbitmq"])
def make_transport(request: pytest.FixtureRequest, settings: Settings) -> Callable[[], Transport]:
    """A transport of each kind (the test runs once per transport and provider)."""
    if request.param == "embedded":
        return lambda: EmbeddedQueue(settings.embedded_queue_path)
    url = request.getfixturevalue("rabbitmq_url")
    return lambda: RabbitMQTransport(url)


def task_failure_headers(
    queue: str, *, table: dict[str, Any] | None = None, **changes: Any
) -> tuple[str, dict[str, str | None], dict[str, Any]]:
    """(task id, the failed message's headers, the consumed message's properties) of a
    Celery task that failed in ``queue``."""
    task_id = str(uuid.uuid4())
    properties: dict[str, Any] = {
        "content_type": "application/x-python-serialize",
        "content_encoding": "binary",
        "correlation_id": task_id,
        "reply_to": "b3c1d2e4-reply",
        "priority": 4,
        "headers": (table or CELERY_TABLE) | {"id": task_id},
    }
    try:
        raise ValueError("card declined")
    except ValueError as exc:
        failure = envelope.capture_failure(exc)
    headers = envelope.failed_message_headers(
        kind=envelope.CELERY,
        task_id=task_id,
        task_name="shop.tasks.charge",
        queue=queue,
        endpoint="shop",
        host="worker-1",
        failure=failure,
        time_of_failure=datetime.now(UTC),
        retries=3,
        content_type=properties["content_type"],
        properties=properties,
    )
    headers.update(changes)
    return task_id, headers, properties


@dataclass(frozen=True)
class StoredTask:
    """A Celery task's failed message as stored: its task id, the failed message's
    headers, the consumed message's properties and the stored attempt."""

    task_id: str
    headers: dict[str, str | None]
    properties: dict[str, Any]
    attempt: FailedAttempt


@dataclass(frozen=True)
class TaskRetries:
    """One test's retries of task messages: the store, a transport of each kind
    (``make_transport``) and a Celery queue of the test's own (``queue``)."""

    settings: Settings
    engine: sa.Engine
    writer: FailedMessageBatchWriter
    body_store: FileSystemBodyStore
    make_transport: Callable[[], Transport]
    queue: str

    def store(
        self, body: bytes, *, table: dict[str, Any] | None = None, **changes: Any
    ) -> StoredTask:
        """Store a failed message of a task that failed in ``queue`` (``task_failure_headers``)."""
        task_id, headers, properties = task_failure_headers(self.queue, table=table, **changes)
        attempt = store_failed(self.settings, self.writer, self.body_store, headers, body)
        return StoredTask(task_id, headers, properties, attempt)

    def retry_and_receive(self, count: int) -> list[Delivery]:
        """Retry every stored message, run one processor pass, take ``count`` from
        ``queue``."""
        retries.retry_all(self.engine)

        async def scenario() -> list[Delivery]:
            async with self.make_transport() as transport:  # type: ignore[attr-defined]
                processor = make_processor(self.settings, self.engine, transport, self.body_store)
                async with asyncio.timeout(TIMEOUT):
                    try:
                        await processor.process_pending()
                    finally:
                        await processor.close()
                    return await self.receive(transport, count)

        return asyncio.run(scenario())

    async def receive(self, transport: Transport, count: int) -> list[Delivery]:
        """The next ``count`` messages of ``queue``, and then no more."""
        async with Collector(transport, self.queue, prefetch=5) as collector:
            deliveries = await take(collector, count)
            await collector.assert_idle(0.3)
        return deliveries

    def with_api(self, scenario: Callable[[httpx.AsyncClient, Transport], Awaitable[Any]]) -> Any:
        """Run ``scenario`` against the app on a transport of ``make_transport``."""
        return run_with_api(
            self.settings,
            self.engine,
            self.body_store,
            scenario,  # type: ignore[arg-type]
            make_transport=self.make_transport,
        )


@pytest.fixture
def task_retries(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    make_transport: Callable[[], Transport],
) -> TaskRetries:
    return TaskRetries(settings, engine, writer, body_store, make_transport, unique_name("celery"))


def test_a_retried_task_message_goes_back_as_its_producer_sent_it(
    task_retries: TaskRetries,
) -> None:
    # A table that went through an earlier retry: its retry headers are replaced.
    stale = CELERY_TABLE | {
        retry_wire.RETRY_UNIQUE_MESSAGE_ID: str(uuid.uuid4()),
        retry_wire.TARGET_ENDPOINT_ADDRESS: "elsewhere",
    }
    task = task_retries.store(PICKLE_BODY, table=stale)

    (delivery,) = task_retries.retry_and_receive(1)

    assert delivery.body == PICKLE_BODY
    sent = delivery.properties
    assert sent is not None
    assert (sent.content_encoding, sent.correlation_id, sent.reply_to, sent.priority) == (
        "binary",
        task.task_id,
        "b3c1d2e4-reply",
        4,
    )
    expected = {
        name: value
        for name, value in task.properties["headers"].items()
        if name != retry_wire.TARGET_ENDPOINT_ADDRESS
    } | {
        retry_wire.RETRY_UNIQUE_MESSAGE_ID: task.attempt.unique_message_id,
        retry_wire.RETRY_ACKNOWLEDGEMENT_QUEUE: task_retries.settings.error_queue,
    }
    assert dict(sent.headers or {}) == expected  # typed: ints, lists, nulls, bytes as sent
    assert delivery.headers["NServiceBus.MessageId"] == task.task_id  # the message-id property
    stored = statuses(task_retries.engine)
    assert stored[task.attempt.unique_message_id] == FailedMessageStatus.RETRY_ISSUED


def test_properties_that_do_not_parse_fail_that_message_and_the_others_go(
    task_retries: TaskRetries,
) -> None:
    good = task_retries.store(b"[[1], {}, {}]")
    bad = task_retries.store(
        b"[[2], {}, {}]", **{retry_wire.TASK_PROPERTIES: '{"headers": [1, 2]}'}
    )

    (delivery,) = task_retries.retry_and_receive(1)

    assert delivery.body == b"[[1], {}, {}]"
    now = statuses(task_retries.engine)
    assert now[good.attempt.unique_message_id] == FailedMessageStatus.RETRY_ISSUED
    assert now[bad.attempt.unique_message_id] == FailedMessageStatus.UNRESOLVED
    with task_retries.engine.connect() as conn:
        operation = conn.execute(sa.select(retry_operations)).one()
    assert operation.failed
    assert (operation.forwarded_count, operation.skipped_count) == (1, 0)  # 1 not sendable


def test_a_task_whose_body_was_not_kept_is_refused_with_the_reason(
    task_retries: TaskRetries,
) -> None:
    reason = "the task message's body is 20971520 bytes, over the 15728640 bytes the Celery"
    good = task_retries.store(b"[[1], {}, {}]")
    not_kept = task_retries.store(b"", **{envelope.BODY_NOT_KEPT: reason})

    (delivery,) = task_retries.retry_and_receive(1)  # never an empty task message

    assert delivery.body == b"[[1], {}, {}]"
    now = statuses(task_retries.engine)
    assert now[good.attempt.unique_message_id] == FailedMessageStatus.RETRY_ISSUED
    assert now[not_kept.attempt.unique_message_id] == FailedMessageStatus.UNRESOLVED
    with task_retries.engine.connect() as conn:
        (operation_id,) = conn.scalars(sa.select(retry_operations.c.id))
        operation = retries.get_operation(conn, operation_id)
        logged = events.list_events(conn, offset=0, limit=50).items
    assert operation is not None and operation.failed
    assert (operation.forwarded_count, operation.skipped_count) == (1, 0)  # 1 not sendable
    assert operation.failure_reason == (
        f"failed message {not_kept.attempt.unique_message_id} cannot be sent: "
        f"the body was not kept: {reason}"
    )
    (refused,) = [item for item in logged if item.event_type == "RetryMessagesUnsendable"]
    assert refused.severity == "warning"
    assert f"/message/{not_kept.attempt.unique_message_id}" in refused.related_to
    assert "1 message cannot be sent (its body was not kept)" in refused.description
    assert reason not in refused.description  # the log quotes ids and counts only


def test_a_kept_body_is_retried_whatever_a_header_says_and_the_note_is_not_carried(
    task_retries: TaskRetries,
) -> None:
    """The header says why a body is absent; a message whose body was stored is sent, as
    the console and the API show it, and a retried message carries no such note."""
    stored = task_retries.store(b"[[1], {}, {}]", **{envelope.BODY_NOT_KEPT: "forged"})

    (delivery,) = task_retries.retry_and_receive(1)

    assert delivery.body == b"[[1], {}, {}]"
    assert envelope.BODY_NOT_KEPT not in delivery.headers
    now = statuses(task_retries.engine)
    assert now[stored.attempt.unique_message_id] == FailedMessageStatus.RETRY_ISSUED


def test_outgoing_message_names_the_header_that_does_not_parse() -> None:
    headers: dict[str, str | None] = {retry_wire.TASK_PROPERTIES: "{not json"}
    with pytest.raises(retry_wire.UnsendableMessage, match=r"Controlroom\.TaskQueue\.Properties"):
        retry_wire.outgoing_message(headers)
    headers = {retry_wire.TASK_PROPERTIES: json.dumps({"priority": 300})}
    with pytest.raises(retry_wire.UnsendableMessage, match="priority"):
        retry_wire.outgoing_message(headers)


def test_an_edited_task_message_keeps_its_properties_with_the_body_edited(
    task_retries: TaskRetries,
) -> None:
    task = task_retries.store(b"[[-1], {}, {}]")
    original = task.attempt.unique_message_id
    edited = editable(task.headers)

    async def scenario(
        api: httpx.AsyncClient, transport: Transport
    ) -> tuple[httpx.Response, httpx.Response, Delivery]:
        refused = await api.post(
            f"/api/edit/{original}",
            json={
                "message_body": "[[1], {}, {}]",
                "message_headers": edited | {retry_wire.TASK_PROPERTIES: "[]"},
            },
        )
        response = await api.post(
            f"/api/edit/{original}",
            json={"message_body": "[[1], {}, {}]", "message_headers": edited},
        )
        (delivery,) = await task_retries.receive(transport, 1)
        return refused, response, delivery

    refused, response, delivery = task_retries.with_api(scenario)

    assert refused.status_code == 400
    assert "Controlroom.TaskQueue.Properties" in refused.text
    assert response.status_code == 202, response.text
    answer = response.json()
    assert delivery.body == b"[[1], {}, {}]"
    sent = delivery.properties
    assert sent is not None
    assert (sent.content_encoding, sent.correlation_id, sent.priority) == (
        "binary",
        task.task_id,
        4,
    )
    assert dict(sent.headers or {}) == task.properties["headers"] | {
        retry_wire.RETRY_UNIQUE_MESSAGE_ID: answer["edit_id"],
        retry_wire.RETRY_ACKNOWLEDGEMENT_QUEUE: task_retries.settings.error_queue,
        retry_wire.EDIT_OF: original,
    }
    assert statuses(task_retries.engine)[original] == FailedMessageStatus.RESOLVED
