"""Dramatiq failures into Controlroom, end to end: real Dramatiq workers (subprocesses of
``dramatiq_worker.py`` on ``dramatiq_app.py``) on a RabbitMQ vhost of each test's own,
Controlroom's real ingestion and retry on every provider (docs/design.md "Python task
queues")."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest
import sqlalchemy as sa
from dramatiq import Message
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.encoder import PickleEncoder
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.identity import deterministic_id
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.errors.retries import wire as retry_wire
from controlroom.integrations import envelope
from controlroom.transport.base import Transport
from controlroom.transport.rabbitmq import RabbitMQTransport
from tests import servers
from tests.retries.conftest import TIMEOUT, make_processor, statuses, wait_for, wait_for_sync

pytestmark = pytest.mark.rabbitmq

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Setup:
    """One test's broker vhost, Dramatiq queue, Controlroom settings and marker file."""

    url: str
    queue: str
    settings: Settings
    marker: Path
    logs: Path

    def env(
        self, kill: str = "", error_url: str = "", max_body: str = "", encoder: str = ""
    ) -> dict[str, str]:
        return os.environ | {
            "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
            "DRAMATIQ_TEST_URL": self.url,
            "DRAMATIQ_TEST_QUEUE": self.queue,
            "DRAMATIQ_TEST_ERROR_QUEUE": self.settings.error_queue,
            "DRAMATIQ_TEST_MARKER": str(self.marker),
            "DRAMATIQ_TEST_KILL": kill,
            "DRAMATIQ_TEST_ERROR_URL": error_url,
            "DRAMATIQ_TEST_MAX_BODY_BYTES": max_body,
            "DRAMATIQ_TEST_ENCODER": encoder,
        }


@pytest.fixture
def setup(settings: Settings, tmp_path: Path) -> Iterator[Setup]:
    url, vhost = servers.create_rabbitmq_vhost()
    try:
        yield Setup(
            url=url,
            queue=f"tasks-{uuid.uuid4().hex[:8]}",
            settings=settings.model_copy(update={"broker_url": url, "error_queue": "error"}),
            marker=tmp_path / "marker",
            logs=tmp_path / "worker.log",
        )
    finally:
        servers.delete_rabbitmq_vhost(vhost)


@contextlib.contextmanager
def worker(
    setup: Setup,
    kill: str = "",
    error_url: str = "",
    max_body: str = "",
    *,
    may_die: bool = False,
    encoder: str = "",
) -> Iterator[subprocess.Popen[str]]:
    """A real Dramatiq worker process, consuming once this yields; terminated after.
    ``may_die``: a task may kill it before it says it is ready (it yields it dead);
    ``encoder``: ``pickle`` for Dramatiq's ``PickleEncoder``."""
    with setup.logs.open("a") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.integrations.dramatiq_worker"],
            cwd=ROOT,
            env=setup.env(kill, error_url, max_body, encoder),
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        if not (may_die and not line and process.wait(TIMEOUT) == -signal.SIGKILL):
            assert line == "ready", setup.logs.read_text()
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.asynccontextmanager
async def ingesting(
    setup: Setup, engine: sa.Engine, body_store: FileSystemBodyStore
) -> AsyncIterator[Transport]:
    """Controlroom's ingestion of the error queue, running for the block."""
    async with RabbitMQTransport(setup.url) as transport:
        service = IngestionService(setup.settings, engine, transport, body_store)
        task = asyncio.create_task(service.run())
        try:
            yield transport
            assert not task.done(), task.exception()
        finally:
            await service.stop()


async def restarting_workers(setup: Setup, done: Callable[[], bool], *, most: int) -> int:
    """Real workers one after another, a new one each time one dies (SIGKILL), until
    ``done()``; answers how many died. Fails when more than ``most`` die (a task
    redelivered for ever)."""
    deaths = 0
    while True:
        with worker(setup, may_die=True) as process:
            while process.poll() is None:
                if await asyncio.to_thread(done):
                    return deaths
                await asyncio.sleep(0.05)
            assert process.returncode == -signal.SIGKILL, setup.logs.read_text()
            deaths += 1
            assert deaths <= most, f"{deaths} worker processes died and it goes on"


def send(setup: Setup, actor: str, *args: Any, delay: int | None = None) -> bytes:
    """Enqueue a message for ``actor`` as a Dramatiq producer does (``delay``: in
    milliseconds, through the delay queue); returns its body as enqueued."""
    broker = RabbitmqBroker(url=setup.url)
    try:
        message = Message(
            queue_name=setup.queue, actor_name=actor, args=args, kwargs={}, options={}
        )
        return broker.enqueue(message, delay=delay).encode()
    finally:
        broker.close()


def queue_depth(setup: Setup, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(setup.url))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


def rows(engine: sa.Engine) -> list[sa.Row[Any]]:
    with engine.connect() as conn:
        return list(
            conn.execute(sa.select(failed_messages).order_by(failed_messages.c.message_type))
        )


def stored_row(engine: sa.Engine, failed_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(failed_messages).where(failed_messages.c.id == failed_id)
        ).one()


def unique_id(setup: Setup, message_body: bytes) -> str:
    return deterministic_id(json.loads(message_body)["message_id"] + setup.queue)


def test_a_failing_actor_is_stored_once_with_traceback_actor_args_and_queue(
    setup: Setup, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    async def scenario() -> None:
        async with ingesting(setup, engine, body_store):
            with worker(setup):
                sent["place_order"] = send(setup, "place_order", 7, "café")
                sent["place_order_retried"] = send(setup, "place_order_retried", 8)
                await wait_for(lambda: len(rows(engine)) == 2)
                await wait_for(lambda: queue_depth(setup, f"{setup.queue}.XQ") == 2)

    sent: dict[str, bytes] = {}
    asyncio.run(scenario())
    once, retried = rows(engine)
    for row, actor, retries in ((once, "place_order", 0), (retried, "place_order_retried", 1)):
        headers = json.loads(row.headers_json)
        assert row.message_type == actor
        assert row.message_id == json.loads(sent[actor])["message_id"]
        assert row.id == unique_id(setup, sent[actor])
        assert row.queue_address == setup.queue
        assert row.receiving_endpoint == setup.queue
        assert row.number_of_processing_attempts == 1
        assert row.status == FailedMessageStatus.UNRESOLVED
        assert row.exception_type == "tests.integrations.dramatiq_app.OrderRejected"
        assert row.stack_trace.startswith("Traceback (most recent call last):")
        assert "in check_order" in row.stack_trace
        assert row.content_type == "application/json"
        assert headers["Controlroom.TaskQueue"] == "dramatiq"
        assert headers["NServiceBus.Retries"] == str(retries)
    assert once.exception_message == "order 7 rejected: café"
    # The body as the worker consumed it, byte for byte: what the producer sent...
    assert once.body_text.encode() == sent["place_order"]
    # ...and, after Dramatiq's own retry, the message Dramatiq re-enqueued.
    body = json.loads(retried.body_text)
    assert body["args"] == [8]
    assert body["options"]["retries"] == 1


def test_a_time_limit_kill_makes_one_failed_message(
    setup: Setup, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    async def scenario() -> None:
        async with ingesting(setup, engine, body_store):
            with worker(setup):
                send(setup, "slow_report")
                await wait_for(lambda: len(rows(engine)) == 1)
                await wait_for(lambda: queue_depth(setup, f"{setup.queue}.XQ") == 1)

    asyncio.run(scenario())
    (row,) = rows(engine)
    assert row.message_type == "slow_report"
    assert row.exception_type == "dramatiq.middleware.time_limit.TimeLimitExceeded"
    assert row.number_of_processing_attempts == 1


@pytest.mark.parametrize(("kill", "attempts"), [("before_publish", 1), ("after_publish", 2)])
def test_a_worker_killed_around_the_failure_leaves_exactly_one_row(
    setup: Setup, engine: sa.Engine, body_store: FileSystemBodyStore, kill: str, attempts: int
) -> None:
    async def scenario() -> None:
        async with ingesting(setup, engine, body_store):
            with worker(setup, kill) as first:
                send(setup, "place_order", 11, "the worker dies")
                assert await asyncio.to_thread(first.wait, TIMEOUT) == -signal.SIGKILL
            with worker(setup):  # RabbitMQ redelivers the unacknowledged message here
                await wait_for(lambda: queue_depth(setup, f"{setup.queue}.XQ") == 1)
                await wait_for(
                    lambda: [r.number_of_processing_attempts for r in rows(engine)] == [attempts]
                )

    asyncio.run(scenario())
    (row,) = rows(engine)
    assert row.message_type == "place_order"


def test_rejections_without_a_run_and_a_body_too_large_are_failed_messages_too(
    setup: Setup, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    undecodable = b"\x80\x04 not a Dramatiq message"

    async def scenario() -> None:
        async with ingesting(setup, engine, body_store):
            with worker(setup, max_body="400"):
                sent["no_such_actor"] = send(setup, "no_such_actor", 1)
                sent["place_order"] = send(setup, "place_order", 13, "x" * 1000)
                connection = pika.BlockingConnection(pika.URLParameters(setup.url))
                connection.channel().basic_publish("", setup.queue, undecodable)
                connection.close()
                await wait_for(lambda: len(rows(engine)) == 3)
                await wait_for(lambda: queue_depth(setup, f"{setup.queue}.XQ") == 3)

    sent: dict[str, bytes] = {}
    asyncio.run(scenario())
    not_decoded, unknown, too_large = rows(engine)
    client = TestClient(create_app(setup.settings, engine, body_store))
    # A body Dramatiq cannot decode: kept byte for byte, as binary.
    assert not_decoded.message_type == "(undecodable Dramatiq message)"
    assert not_decoded.exception_type == "dramatiq.errors.DecodeError"
    assert not_decoded.queue_address == setup.queue
    assert not_decoded.content_type == "application/octet-stream"
    assert client.get(f"/api/messages/{not_decoded.id}/body").content == undecodable
    # An actor this worker does not know: rejected before any run.
    assert unknown.message_type == "no_such_actor"
    assert unknown.exception_type == "dramatiq.errors.ActorNotFound"
    assert unknown.body_text.encode() == sent["no_such_actor"]
    # A body over max_body_bytes: the failure without the body, saying why.
    assert too_large.exception_type == "tests.integrations.dramatiq_app.OrderRejected"
    assert too_large.body_size == 0
    reason = json.loads(too_large.headers_json)["Controlroom.TaskQueue.BodyNotKept"]
    assert f"body of {len(sent['place_order'])} bytes" in reason


def test_a_retry_from_controlroom_runs_again_folds_a_new_failure_and_success_resolves_it(
    setup: Setup, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    client = TestClient(create_app(setup.settings, engine, body_store))

    async def retry(transport: Transport, failed_id: str) -> None:
        response = await asyncio.to_thread(client.post, f"/api/errors/{failed_id}/retry")
        assert response.status_code == 202, response.text
        processor = make_processor(setup.settings, engine, transport, body_store)
        assert await processor.process_pending() == 1
        await processor.close()

    async def scenario() -> str:
        async with ingesting(setup, engine, body_store) as transport:
            with worker(setup):
                failed_id = unique_id(setup, send(setup, "flaky", 9))
                await wait_for(
                    lambda: statuses(engine).get(failed_id) == FailedMessageStatus.UNRESOLVED
                )
                await retry(transport, failed_id)  # the marker is still missing: fails again
                await wait_for(
                    lambda: [r.number_of_processing_attempts for r in rows(engine)] == [2]
                )
                assert statuses(engine) == {failed_id: FailedMessageStatus.UNRESOLVED}

                setup.marker.touch()
                await retry(transport, failed_id)  # now the actor succeeds and confirms
                await wait_for(lambda: statuses(engine)[failed_id] == FailedMessageStatus.RESOLVED)
                return failed_id

    asyncio.run(scenario())
    (row,) = rows(engine)
    assert row.number_of_processing_attempts == 2
    assert queue_depth(setup, f"{setup.queue}.XQ") == 2  # Dramatiq dead-lettered both failures


def test_a_pickled_message_is_kept_binary_and_retried_byte_exact_until_it_succeeds(
    setup: Setup, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    client = TestClient(create_app(setup.settings, engine, body_store))
    message = Message(queue_name=setup.queue, actor_name="flaky", args=(15,), kwargs={}, options={})
    body = PickleEncoder().encode(message.asdict())  # what a producer on pickle sends
    failed_id = deterministic_id(message.message_id + setup.queue)

    async def retry(transport: Transport) -> None:
        response = await asyncio.to_thread(client.post, f"/api/errors/{failed_id}/retry")
        assert response.status_code == 202, response.text
        processor = make_processor(setup.settings, engine, transport, body_store)
        assert await processor.process_pending() == 1
        await processor.close()

    async def scenario() -> tuple[Any, Any]:
        async with ingesting(setup, engine, body_store) as transport:
            with worker(setup, encoder="pickle"):
                broker = RabbitmqBroker(url=setup.url)  # the queue as Dramatiq declares it
                try:
                    broker.declare_queue(setup.queue, ensure=True)
                    broker.channel.basic_publish(
                        "", setup.queue, body, pika.BasicProperties(delivery_mode=2)
                    )
                finally:
                    broker.close()
                await wait_for(lambda: failed_id in statuses(engine))
                first = stored_row(engine, failed_id)

                await retry(transport)  # the marker is missing: fails again
                await wait_for(
                    lambda: stored_row(engine, failed_id).number_of_processing_attempts == 2
                )
                again = stored_row(engine, failed_id)

                setup.marker.touch()
                await retry(transport)  # decoded and run: succeeds and confirms
                await wait_for(lambda: statuses(engine)[failed_id] == FailedMessageStatus.RESOLVED)
                return first, again

    first, again = asyncio.run(scenario())
    for row in (first, again):  # binary: no text, the bytes in the body store
        assert row.body_text is None and row.body_stored_externally
        assert row.exception_type == "tests.integrations.dramatiq_app.OrderRejected"
        assert body_store.get(row.body_key) == body
    # The second attempt's body is the retried message as the worker consumed it: the
    # bytes the producer sent, byte for byte (the body store's key is their SHA-256).
    assert json.loads(again.headers_json)[retry_wire.RETRY_UNIQUE_MESSAGE_ID] == failed_id
    assert again.body_key == first.body_key
    assert client.get(f"/api/messages/{failed_id}/body").content == body


def test_a_failure_the_error_queue_cannot_take_is_logged_whole_and_dead_lettered(
    setup: Setup, engine: sa.Engine
) -> None:
    unreachable = "amqp://guest:guest@127.0.0.1:1/"  # nothing listens on port 1
    with worker(setup, error_url=unreachable):
        send(setup, "place_order", 12, "nowhere to report")
        wait_for_sync(lambda: queue_depth(setup, f"{setup.queue}.XQ") == 1)
    log = setup.logs.read_text()
    assert "could not send the failure of Dramatiq message" in log
    assert "OrderRejected: order 12 rejected: nowhere to report" in log  # the traceback
    assert '"args":[12,"nowhere to report"]' in log  # and the body


def test_a_retry_that_dramatiq_retries_again_is_confirmed_when_dramatiq_s_retry_succeeds(
    setup: Setup, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    client = TestClient(create_app(setup.settings, engine, body_store))

    async def scenario() -> None:
        async with ingesting(setup, engine, body_store) as transport:
            with worker(setup):
                failed_id = unique_id(setup, send(setup, "rejected_then_flaky", 14))
                await wait_for(
                    lambda: statuses(engine).get(failed_id) == FailedMessageStatus.UNRESOLVED
                )
                setup.marker.touch()
                response = await asyncio.to_thread(client.post, f"/api/errors/{failed_id}/retry")
                assert response.status_code == 202, response.text
                processor = make_processor(setup.settings, engine, transport, body_store)
                assert await processor.process_pending() == 1
                await processor.close()
                # The retried run fails with an error Dramatiq retries; Dramatiq's own
                # retry (a message it enqueues itself) succeeds and confirms the retry.
                await wait_for(lambda: statuses(engine)[failed_id] == FailedMessageStatus.RESOLVED)

    asyncio.run(scenario())
    assert setup.marker.with_suffix(".once").exists()
    (row,) = rows(engine)
    assert row.number_of_processing_attempts == 1


def test_an_actor_that_kills_its_worker_every_run_is_one_failed_message_then_retried(
    setup: Setup, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    client = TestClient(create_app(setup.settings, engine, body_store))
    limit = envelope.DEFAULT_MAX_WORKER_DEATHS
    runs = setup.marker.with_suffix(".runs")

    async def scenario() -> None:
        async with ingesting(setup, engine, body_store) as transport:
            sent["body"] = send(setup, "kills_its_worker", 21)
            failed_id = unique_id(setup, sent["body"])
            reported = lambda: failed_id in statuses(engine)  # noqa: E731
            deaths = await restarting_workers(setup, reported, most=limit + 2)
            assert deaths == limit == len(runs.read_text().split())
            await wait_for(lambda: queue_depth(setup, f"{setup.queue}.XQ") == 1)
            assert queue_depth(setup, setup.queue) == 0

            # Fixed, but the retried run still kills its worker once: a retry counts
            # worker deaths from zero, so the redelivery runs it again and it succeeds.
            setup.marker.touch()
            response = await asyncio.to_thread(client.post, f"/api/errors/{failed_id}/retry")
            assert response.status_code == 202, response.text
            processor = make_processor(setup.settings, engine, transport, body_store)
            assert await processor.process_pending() == 1
            await processor.close()
            resolved = lambda: statuses(engine)[failed_id] == FailedMessageStatus.RESOLVED  # noqa: E731
            assert await restarting_workers(setup, resolved, most=limit) == 1
            assert queue_depth(setup, setup.queue) == 0

    sent: dict[str, bytes] = {}
    asyncio.run(scenario())
    (row,) = rows(engine)
    assert row.exception_type == "controlroom.integrations.WorkerDied"
    assert row.exception_message == f"the worker process died {limit} times while holding the task"
    assert row.message_type == "kills_its_worker"
    assert row.message_id == json.loads(sent["body"])["message_id"]
    assert row.queue_address == setup.queue
    assert row.receiving_endpoint == setup.queue
    assert row.number_of_processing_attempts == 1
    assert row.body_text.encode() == sent["body"]  # the message as sent, byte for byte
    assert envelope.REDELIVERIES not in row.headers_json
    assert len(runs.read_text().split()) == limit + 2  # the retry: killed once, then ran


def test_an_actor_that_kills_its_worker_once_runs_again_and_makes_no_failed_message(
    setup: Setup, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    setup.marker.touch()  # the actor kills its worker on its first run only
    runs = setup.marker.with_suffix(".runs")

    async def scenario() -> None:
        async with ingesting(setup, engine, body_store):
            send(setup, "kills_its_worker", 22)
            # Prefetched by the worker the first message kills: redelivered too.
            failing = unique_id(setup, send(setup, "place_order", 23, "prefetched"))

            def done() -> bool:
                ran_twice = runs.exists() and len(runs.read_text().split()) == 2
                return ran_twice and failing in statuses(engine)

            assert await restarting_workers(setup, done, most=1) == 1
            assert queue_depth(setup, setup.queue) == 0

    asyncio.run(scenario())
    assert [row.message_type for row in rows(engine)] == ["place_order"]


def test_a_delayed_message_held_by_workers_that_die_is_not_counted(
    setup: Setup, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    delay_queue = f"{setup.queue}.DQ"
    limit = envelope.DEFAULT_MAX_WORKER_DEATHS

    async def scenario() -> None:
        async with ingesting(setup, engine, body_store):
            sent["body"] = send(setup, "place_order", 41, "later", delay=3_600_000)
            for _ in range(limit + 1):  # each worker holds it (unacknowledged), then dies
                with worker(setup) as process:
                    await wait_for(lambda: queue_depth(setup, delay_queue) == 0)
                    process.kill()
                    process.wait()
                await wait_for(lambda: queue_depth(setup, delay_queue) == 1)
            with worker(setup):
                await wait_for(lambda: queue_depth(setup, delay_queue) == 0)
                failing = unique_id(setup, send(setup, "place_order", 42, "now"))
                await wait_for(lambda: failing in statuses(engine))
            await wait_for(lambda: queue_depth(setup, delay_queue) == 1)

    sent: dict[str, bytes] = {}
    asyncio.run(scenario())
    assert [json.loads(row.body_text)["args"] for row in rows(engine)] == [[42, "now"]]
    connection = pika.BlockingConnection(pika.URLParameters(setup.url))
    try:
        method, properties, body = connection.channel().basic_get(delay_queue, auto_ack=True)
    finally:
        connection.close()
    assert method is not None and method.redelivered
    assert body == sent["body"]  # still waiting, as enqueued, not published again
    assert envelope.REDELIVERIES not in (properties.headers or {})
