"""Celery failures in Controlroom with real workers (subprocesses) on RabbitMQ and
Controlroom's real ingestion, on every provider (docs/design.md "Python task queues"):
a failed task is stored whole, retried onto its queue from the API, fails again as the
same failed message or succeeds and is confirmed; hard time limits, a lost pool process
and a worker killed before or after the publish each leave exactly one failed message;
a group retry and an edited task run on a real worker too."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from celery import Celery
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.grouping import EXCEPTION_TYPE_AND_PYTHON_FRAME
from controlroom.errors.ingest.identity import deterministic_id
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.integrations import envelope
from controlroom.integrations.celery import install
from controlroom.transport.rabbitmq import RabbitMQTransport
from tests.retries.conftest import TIMEOUT, make_processor, statuses, unique_name, wait_for
from tests.servers import TEST_CLIENT_TIMEOUT

pytestmark = pytest.mark.rabbitmq

ROOT = Path(__file__).resolve().parents[2]
ENDPOINT = "shop"  # the test app's name: the processing endpoint


@pytest.fixture
def broker_settings(settings: Settings, rabbitmq_url: str) -> Settings:
    return settings.model_copy(
        update={"broker_url": rabbitmq_url, "error_queue": unique_name("error")}
    )


@contextlib.contextmanager
def celery_worker(
    settings: Settings,
    queue: str,
    state: Path,
    *,
    pool: str = "solo",
    may_die: bool = False,
    **env: str,
) -> Iterator[subprocess.Popen[bytes]]:
    """A real worker of ``tests.integrations.celery_app`` consuming ``queue``, ready when
    it returns (or, ``may_die``, killed by a task before); stopped (SIGTERM, then
    SIGKILL) at the end."""
    state.mkdir(parents=True, exist_ok=True)
    log_path = state / f"worker-{uuid.uuid4().hex[:6]}.log"
    environment = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "CELERY_TEST_BROKER": str(settings.broker_url),
        "CELERY_TEST_QUEUE": queue,
        "CELERY_TEST_ERROR_QUEUE": settings.error_queue,
        "CELERY_TEST_STATE": str(state),
        "C_FORCE_ROOT": "1",  # pickle is accepted; CI machines may run tests as root
        **env,
    }
    command = [sys.executable, "-m", "celery", "-A", "tests.integrations.celery_app"]
    command += ["worker", "-P", pool, "-c", "1", "-Q", queue, "-l", "INFO"]
    command += ["--without-heartbeat", "--without-mingle", "--without-gossip"]
    command += ["-n", f"{uuid.uuid4().hex[:8]}@%h"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + TIMEOUT
        while b" ready." not in log_path.read_bytes():
            if may_die and process.poll() == -signal.SIGKILL:
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"worker did not start:\n{log_path.read_text()}")
            time.sleep(0.1)
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def producer(settings: Settings) -> Celery:
    """A producer app of its own (the test process sends tasks like any client), with
    the integration installed, as the app's module installs it for its producers too:
    its task messages carry the time they were sent."""
    app = Celery("producer", broker=settings.broker_url)
    install(app)
    return app


def send(settings: Settings, queue: str, name: str, *args: Any, **options: Any) -> str:
    with contextlib.closing(producer(settings)) as app:
        result = app.send_task(name, args=args, queue=queue, **options)
    return str(result.id)


@contextlib.asynccontextmanager
async def controlroom(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> AsyncIterator[tuple[TestClient, Any]]:
    """Controlroom ingesting the error queue, with the API and a retry processor."""
    async with RabbitMQTransport(str(settings.broker_url)) as transport:
        service = IngestionService(settings, engine, transport, body_store)
        ingesting = asyncio.create_task(service.run())
        processor = make_processor(settings, engine, transport, body_store)
        client = TestClient(create_app(settings, engine, body_store, transport=transport))
        try:
            async with asyncio.timeout(TIMEOUT * 3):
                yield client, processor
            assert not ingesting.done(), ingesting.exception()
        finally:
            await processor.close()
            await service.stop()


async def retry(client: TestClient, processor: Any, unique_id: str) -> None:
    response = await asyncio.to_thread(client.post, f"/api/errors/{unique_id}/retry")
    assert response.status_code == 202, response.text
    assert await processor.process_pending() == 1


def row(engine: sa.Engine, unique_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(failed_messages).where(failed_messages.c.id == unique_id)
        ).one_or_none()


def rows(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(failed_messages)))


def received_files(state: Path, task_id: str) -> list[Path]:
    """The body files the workers wrote for ``task_id``, in the order received."""
    return sorted(
        state.glob(f"received-{task_id}-*.bin"), key=lambda p: int(p.stem.rsplit("-", 1)[1])
    )


def received(state: Path, task_id: str) -> list[bytes]:
    """The bodies the workers received for ``task_id``, in order."""
    return [path.read_bytes() for path in received_files(state, task_id)]


def unique_id_of(task_id: str) -> str:
    return deterministic_id(task_id + ENDPOINT)


def test_a_failed_task_is_stored_fails_again_as_the_same_row_and_resolves_when_fixed(
    broker_settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore, tmp_path: Path
) -> None:
    settings = broker_settings
    queue = unique_name("celery")
    state = tmp_path / "state"

    async def scenario() -> str:
        with celery_worker(settings, queue, state):
            async with controlroom(settings, engine, body_store) as (client, processor):
                before_sending = datetime.now(UTC)
                task_id = send(settings, queue, "shop.charge", 7, {"eur": 12.5})
                unique_id = unique_id_of(task_id)
                await wait_for(lambda: row(engine, unique_id) is not None)
                stored = row(engine, unique_id)
                assert stored.status == FailedMessageStatus.UNRESOLVED
                # The time the producer sent it (stamped by install at publish), UTC.
                assert before_sending <= stored.time_sent <= stored.last_failure_at
                assert stored.message_type == "shop.charge"
                assert stored.exception_type == "ValueError"
                assert stored.exception_message == "card declined for order 7"
                assert "in check_card" in stored.stack_trace
                assert stored.stack_trace.rstrip().endswith("ValueError: card declined for order 7")
                assert stored.queue_address == queue
                assert stored.receiving_endpoint == ENDPOINT
                body = client.get(f"/api/messages/{unique_id}/body")
                assert body.content == received(state, task_id)[0]
                assert json.loads(body.content)[0] == [7, {"eur": 12.5}]
                headers = json.loads(stored.headers_json)
                assert headers[envelope.TASK_QUEUE] == "celery"
                assert headers["NServiceBus.TimeSent"].endswith(" Z")

                await retry(client, processor, unique_id)  # runs again on the worker, fails
                await wait_for(lambda: row(engine, unique_id).number_of_processing_attempts == 2)
                assert statuses(engine) == {unique_id: FailedMessageStatus.UNRESOLVED}

                (state / "fixed-7").write_text("")
                await retry(client, processor, unique_id)  # now it succeeds and confirms
                await wait_for(lambda: statuses(engine)[unique_id] == FailedMessageStatus.RESOLVED)
                return task_id

    task_id = asyncio.run(scenario())

    assert len(rows(engine)) == 1
    first, again, fixed = received(state, task_id)
    assert first == again == fixed  # the task message itself went back each time


def test_a_group_retry_runs_the_group_s_tasks_on_a_worker_and_resolves_them(
    broker_settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore, tmp_path: Path
) -> None:
    settings = broker_settings
    queue = unique_name("celery")
    state = tmp_path / "state"
    orders = (41, 42)

    async def scenario() -> list[str]:
        with celery_worker(settings, queue, state):
            async with controlroom(settings, engine, body_store) as (client, processor):
                task_ids = [send(settings, queue, "shop.charge", order, 1) for order in orders]
                ids = [unique_id_of(task_id) for task_id in task_ids]
                await wait_for(lambda: all(row(engine, i) is not None for i in ids))
                groups = []
                for unique_id in ids:
                    answer = await asyncio.to_thread(client.get, f"/api/errors/{unique_id}")
                    detail = answer.json()
                    groups += [
                        group["id"]
                        for group in detail["failure_groups"]
                        if group["type"] == EXCEPTION_TYPE_AND_PYTHON_FRAME
                    ]
                group_id, same = groups  # one cause: the same bug in check_card
                assert group_id == same

                for order in orders:
                    (state / f"fixed-{order}").write_text("")
                response = await asyncio.to_thread(
                    client.post, f"/api/recoverability/groups/{group_id}/errors/retry"
                )
                assert response.status_code == 202, response.text
                assert await processor.process_pending() >= 1
                await wait_for(
                    lambda: [statuses(engine)[i] for i in ids] == [FailedMessageStatus.RESOLVED] * 2
                )
                return task_ids

    task_ids = asyncio.run(scenario())

    assert len(rows(engine)) == 2
    for task_id in task_ids:
        first, retried = received(state, task_id)
        assert retried == first
        assert (state / f"succeeded-{task_id}").exists()


def test_an_edited_task_runs_on_a_worker_and_the_original_is_resolved(
    broker_settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore, tmp_path: Path
) -> None:
    settings = broker_settings
    queue = unique_name("celery")
    state = tmp_path / "state"

    async def scenario() -> tuple[str, bytes]:
        with celery_worker(settings, queue, state):
            async with controlroom(settings, engine, body_store) as (client, _):
                task_id = send(settings, queue, "shop.charge", 43, {"eur": 5})
                unique_id = unique_id_of(task_id)
                await wait_for(lambda: row(engine, unique_id) is not None)
                detail = (await asyncio.to_thread(client.get, f"/api/errors/{unique_id}")).json()
                body = await asyncio.to_thread(client.get, f"/api/messages/{unique_id}/body")
                call = json.loads(body.content)
                call[0][0] = 44  # the operator corrects the order number
                (state / "fixed-44").write_text("")
                edited = json.dumps(call)
                headers = {k: v for k, v in detail["headers"].items() if v is not None}
                # The edit publishes on the app's transport: in this event loop.
                api = httpx.AsyncClient(
                    transport=httpx.ASGITransport(client.app),
                    base_url="http://test",
                    timeout=TEST_CLIENT_TIMEOUT,
                )
                async with api:
                    response = await api.post(
                        f"/api/edit/{unique_id}",
                        json={"message_body": edited, "message_headers": headers},
                    )
                assert response.status_code == 202, response.text
                assert statuses(engine)[unique_id] == FailedMessageStatus.RESOLVED
                await wait_for(lambda: (state / f"succeeded-{task_id}").exists())
                return task_id, edited.encode()

    task_id, edited = asyncio.run(scenario())

    first, copy = received(state, task_id)
    assert json.loads(first)[0] == [43, {"eur": 5}]
    assert copy == edited  # the edited body, run by the worker
    assert [r.status for r in rows(engine)] == [FailedMessageStatus.RESOLVED]  # no new failure


def test_a_pickled_task_is_retried_byte_exact_with_its_typed_headers(
    broker_settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore, tmp_path: Path
) -> None:
    settings = broker_settings
    queue = unique_name("celery")
    state = tmp_path / "state"

    async def scenario() -> str:
        with celery_worker(settings, queue, state):
            async with controlroom(settings, engine, body_store) as (client, processor):
                task_id = send(
                    settings, queue, "shop.charge", 8, b"\x00\xff raw", serializer="pickle"
                )
                unique_id = unique_id_of(task_id)
                await wait_for(lambda: row(engine, unique_id) is not None)
                stored = row(engine, unique_id)  # kept as binary: no text, in the body store
                assert stored.body_text is None and stored.body_stored_externally
                assert stored.content_type == "application/x-python-serialize"
                body = await asyncio.to_thread(client.get, f"/api/messages/{unique_id}/body")
                assert body.content == received(state, task_id)[0]
                (state / "fixed-8").write_text("")
                await retry(client, processor, unique_id)
                await wait_for(lambda: statuses(engine)[unique_id] == FailedMessageStatus.RESOLVED)
                return task_id

    task_id = asyncio.run(scenario())

    first, retried = received(state, task_id)
    assert retried == first  # byte for byte
    assert first.startswith(b"\x80")  # a pickle, stored as binary
    headers = [path.with_suffix(".headers").read_text() for path in received_files(state, task_id)]
    assert headers[0] != headers[1]  # the retry added its headers to the typed table
    assert "'retries', 0" in headers[1] and "'timelimit', [None, None]" in headers[1]


@pytest.mark.parametrize(
    ("kill", "attempts"),
    [("CELERY_TEST_KILL_BEFORE_PUBLISH", 1), ("CELERY_TEST_KILL_AFTER_PUBLISH", 2)],
)
def test_a_worker_killed_around_the_failure_leaves_exactly_one_row(
    broker_settings: Settings,
    engine: sa.Engine,
    body_store: FileSystemBodyStore,
    tmp_path: Path,
    kill: str,
    attempts: int,
) -> None:
    """Killed before the publish: the failure was never sent, the redelivered task fails
    again and is sent once. Killed after it: the failure is held by the broker, and the
    redelivered task's second failure folds into the same row."""
    settings = broker_settings
    queue = unique_name("celery")
    state = tmp_path / "state"

    async def scenario() -> str:
        async with controlroom(settings, engine, body_store):
            with celery_worker(settings, queue, state, **{kill: "1"}) as w:
                task_id = send(settings, queue, "shop.charge", 9, 1)
                await asyncio.to_thread(w.wait, TIMEOUT)
                assert w.returncode == -signal.SIGKILL
            unique_id = unique_id_of(task_id)
            if kill == "CELERY_TEST_KILL_AFTER_PUBLISH":
                await wait_for(lambda: row(engine, unique_id) is not None)  # the publish held
            with celery_worker(settings, queue, state):  # redelivered, fails again
                await wait_for(
                    lambda: (
                        getattr(row(engine, unique_id), "number_of_processing_attempts", 0)
                        == attempts
                    )
                )
                marker = send(settings, queue, "shop.charge", 19, 1)  # behind it in the queue
                await wait_for(lambda: row(engine, unique_id_of(marker)) is not None)
            return task_id

    task_id = asyncio.run(scenario())

    assert len(received(state, task_id)) == 2  # killed with it, then the redelivered copy
    stored = row(engine, unique_id_of(task_id))
    assert stored.number_of_processing_attempts == attempts
    assert stored.exception_type == "ValueError"
    assert len(rows(engine)) == 2  # it and the marker task


def test_each_way_a_task_ends_for_good_makes_one_failure_and_a_celery_retry_none(
    broker_settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore, tmp_path: Path
) -> None:
    settings = broker_settings
    queue = unique_name("celery")
    state = tmp_path / "state"

    async def scenario() -> list[str]:
        with celery_worker(settings, queue, state, pool="prefork"):
            async with controlroom(settings, engine, body_store):
                ids = [
                    send(settings, queue, "shop.slow"),
                    send(settings, queue, "shop.crash"),
                    send(settings, queue, "shop.charge", 10, "x" * 2_000_000),
                    send(settings, queue, "shop.retrying", 14),
                    send(settings, queue, "shop.rejecting", 15),
                ]
                await wait_for(lambda: len(rows(engine)) == 5)
                marker = send(settings, queue, "shop.charge", 11, 1)  # after the three
                await wait_for(lambda: row(engine, unique_id_of(marker)) is not None)
                return ids

    slow, crash, large, retried, rejected = (
        row(engine, unique_id_of(task_id)) for task_id in asyncio.run(scenario())
    )
    assert slow.exception_type == "billiard.exceptions.TimeLimitExceeded"  # Celery's is it
    assert crash.exception_type == "billiard.exceptions.WorkerLostError"
    assert large.exception_type == "ValueError"
    assert retried.exception_type == "ConnectionError"  # after Celery's own two retries
    assert json.loads(retried.headers_json)["NServiceBus.Retries"] == "2"
    assert rejected.exception_type == "celery.exceptions.Reject"
    everything = (slow, crash, large, retried, rejected)
    assert [r.number_of_processing_attempts for r in everything] == [1] * 5
    assert large.body_size == 0
    assert "max_body_bytes" in json.loads(large.headers_json)[envelope.BODY_NOT_KEPT]


def test_a_failure_the_broker_refuses_is_logged_and_requeued_then_sent_once(
    broker_settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore, tmp_path: Path
) -> None:
    settings = broker_settings
    queue = unique_name("celery")
    state = tmp_path / "state"
    with contextlib.closing(producer(settings)) as app, app.connection_for_write() as conn:
        channel = conn.default_channel
        refusing = {"x-max-length": 0, "x-overflow": "reject-publish"}  # the broker nacks
        channel.queue_declare(settings.error_queue, durable=True, arguments=refusing)

        async def scenario() -> str:
            with celery_worker(settings, queue, state):
                task_id = send(settings, queue, "shop.charge", 12, 1)
                logs = list(state.glob("worker-*.log"))
                await wait_for(lambda: b"could not be sent" in logs[0].read_bytes())
                assert task_id.encode() in logs[0].read_bytes()  # the failed message, whole
                channel.queue_delete(settings.error_queue)  # the error queue is back
                async with controlroom(settings, engine, body_store):
                    unique_id = unique_id_of(task_id)
                    await wait_for(lambda: row(engine, unique_id) is not None)
                    marker = send(settings, queue, "shop.charge", 13, 1)
                    await wait_for(lambda: row(engine, unique_id_of(marker)) is not None)
            return task_id

        task_id = asyncio.run(scenario())

    assert len(received(state, task_id)) >= 2  # requeued, run again
    assert row(engine, unique_id_of(task_id)).number_of_processing_attempts == 1


async def restarting_workers(
    settings: Settings, queue: str, state: Path, done: Callable[[], bool], *, most: int
) -> int:
    """Real workers one after another, a new one each time one dies (SIGKILL), until
    ``done()``; answers how many died. Fails when more than ``most`` die (a task
    redelivered for ever)."""
    deaths = 0
    while True:
        with celery_worker(settings, queue, state, may_die=True) as process:
            while process.poll() is None:
                if await asyncio.to_thread(done):
                    return deaths
                await asyncio.sleep(0.05)
            assert process.returncode == -signal.SIGKILL
            deaths += 1
            assert deaths <= most, f"{deaths} worker processes died and it goes on"


def runs(state: Path, order: int) -> int:
    path = state / f"runs-{order}"
    return len(path.read_text().split()) if path.exists() else 0


def test_a_task_that_kills_its_worker_every_run_is_one_failed_message_then_retried(
    broker_settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore, tmp_path: Path
) -> None:
    settings = broker_settings
    queue = unique_name("celery")
    state = tmp_path / "state"
    state.mkdir()
    limit = envelope.DEFAULT_MAX_WORKER_DEATHS

    async def scenario() -> str:
        async with controlroom(settings, engine, body_store) as (client, processor):
            task_id = send(settings, queue, "shop.kills_worker", 31)
            unique_id = unique_id_of(task_id)
            reported = lambda: row(engine, unique_id) is not None  # noqa: E731
            deaths = await restarting_workers(settings, queue, state, reported, most=limit + 2)
            assert deaths == limit == runs(state, 31)
            assert queue_depth(settings, queue) == 0

            # Fixed, but the retried run still kills its worker once: a retry counts
            # worker deaths from zero, so the redelivery runs it again and it succeeds.
            (state / "fixed-31").write_text("")
            await retry(client, processor, unique_id)
            resolved = lambda: statuses(engine)[unique_id] == FailedMessageStatus.RESOLVED  # noqa: E731
            assert await restarting_workers(settings, queue, state, resolved, most=limit) == 1
            assert queue_depth(settings, queue) == 0
            return task_id

    task_id = asyncio.run(scenario())
    (stored,) = rows(engine)
    assert stored.exception_type == "controlroom.integrations.WorkerDied"
    assert stored.exception_message == (
        f"the worker process died {limit} times while holding the task"
    )
    assert stored.message_type == "shop.kills_worker"
    assert stored.message_id == task_id
    assert stored.queue_address == queue
    assert stored.receiving_endpoint == ENDPOINT
    assert stored.number_of_processing_attempts == 1
    assert envelope.REDELIVERIES not in json.loads(stored.headers_json)[envelope.TASK_PROPERTIES]
    assert runs(state, 31) == limit + 2  # the retry: killed once, then ran


def test_a_task_that_kills_its_worker_once_runs_again_and_makes_no_failed_message(
    broker_settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore, tmp_path: Path
) -> None:
    settings = broker_settings
    queue = unique_name("celery")
    state = tmp_path / "state"
    state.mkdir()
    (state / "fixed-32").write_text("")  # kills its worker on the first run only

    async def scenario() -> None:
        async with controlroom(settings, engine, body_store):
            send(settings, queue, "shop.kills_worker", 32)
            failing = unique_id_of(send(settings, queue, "shop.charge", 33, 1))

            def done() -> bool:
                return runs(state, 32) == 2 and row(engine, failing) is not None

            assert await restarting_workers(settings, queue, state, done, most=1) == 1
            assert queue_depth(settings, queue) == 0

    asyncio.run(scenario())
    assert [r.message_type for r in rows(engine)] == ["shop.charge"]


def test_an_eta_task_held_by_workers_that_die_is_not_counted(
    broker_settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore, tmp_path: Path
) -> None:
    settings = broker_settings
    queue = unique_name("celery")
    state = tmp_path / "state"
    limit = envelope.DEFAULT_MAX_WORKER_DEATHS

    async def scenario() -> str:
        async with controlroom(settings, engine, body_store):
            task_id = send(settings, queue, "shop.charge", 34, 1, countdown=3600)
            for held in range(1, limit + 2):  # each worker holds it, waiting; then dies
                with celery_worker(settings, queue, state) as process:
                    await wait_for(lambda: len(received(state, task_id)) == held)  # noqa: B023
                    process.kill()
                    process.wait()
            with celery_worker(settings, queue, state):
                await wait_for(lambda: len(received(state, task_id)) == limit + 2)
                failing = unique_id_of(send(settings, queue, "shop.charge", 35, 1))
                await wait_for(lambda: row(engine, failing) is not None)
            return task_id

    task_id = asyncio.run(scenario())
    assert [r.message_type for r in rows(engine)] == ["shop.charge"]  # only the other one
    headers = [path.with_suffix(".headers").read_text() for path in received_files(state, task_id)]
    assert not [text for text in headers if envelope.REDELIVERIES in text]


def queue_depth(settings: Settings, queue: str) -> int:
    with contextlib.closing(producer(settings)) as app, app.connection_for_write() as conn:
        return int(conn.default_channel.queue_declare(queue, passive=True).message_count)


def run_demo(
    rabbitmq_url: str, tmp_path: Path, failures: int, *, force_root: bool
) -> tuple[list[dict[str, str | None]], str]:
    """Run ``controlroom demo celery`` until ``failures`` failed messages reached its error
    queue; answers them and the demo's output."""
    error_queue = unique_name("error")
    env = {name: value for name, value in os.environ.items() if name != "C_FORCE_ROOT"} | {
        "PYTHONPATH": str(ROOT / "src"),
        "CONTROLROOM_BROKER_URL": rabbitmq_url,
        "CONTROLROOM_ERROR_QUEUE": error_queue,
        "CONTROLROOM_DATA_DIR": str(tmp_path / "data"),
    }
    if force_root:
        env["C_FORCE_ROOT"] = "1"  # the demo's worker accepts pickle; CI may run as root
    command = [sys.executable, "-c", "from controlroom.cli import app; app()", "demo", "celery"]
    log_path = tmp_path / "demo.log"
    with log_path.open("wb") as log:
        demo = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    async def collect() -> list[dict[str, str | None]]:
        seen: list[dict[str, str | None]] = []
        async with RabbitMQTransport(rabbitmq_url) as transport, asyncio.timeout(TIMEOUT):
            async for delivery in transport.consume(error_queue, 10):
                seen.append(dict(delivery.headers))
                await delivery.ack()
                if len(seen) == failures:
                    return seen
        return seen

    try:
        seen = asyncio.run(collect())
    finally:
        demo.terminate()
        demo.wait(30)
    return seen, log_path.read_text()


def test_the_celery_demo_fails_its_tasks_into_the_error_queue(
    rabbitmq_url: str, tmp_path: Path
) -> None:
    failures, output = run_demo(rabbitmq_url, tmp_path, 5, force_root=True)
    assert {f["NServiceBus.ExceptionInfo.ExceptionType"] for f in failures} == {
        "KeyError",
        "ConnectionError",
        "TimeoutError",
        "ZeroDivisionError",
    }, output
    assert {f[envelope.TASK_QUEUE] for f in failures} == {"celery"}
    assert {f["NServiceBus.FailedQ"] for f in failures} == {"demo.shop"}


@pytest.mark.skipif(os.geteuid() != 0, reason="what the demo does as root needs root")
def test_the_celery_demo_runs_as_root_without_its_pickled_task(
    rabbitmq_url: str, tmp_path: Path
) -> None:
    failures, output = run_demo(rabbitmq_url, tmp_path, 4, force_root=False)
    assert {f["NServiceBus.ExceptionInfo.ExceptionType"] for f in failures} == {
        "KeyError",
        "ConnectionError",
        "TimeoutError",
    }, output
    assert "the pickled task is left out" in output


def test_the_celery_demo_needs_rabbitmq(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from controlroom.cli import app

    result = CliRunner().invoke(
        app,
        ["demo", "celery"],
        env={"CONTROLROOM_DATA_DIR": str(tmp_path), "CONTROLROOM_BROKER_URL": ""},
    )
    assert result.exit_code == 2
    assert "needs RabbitMQ" in result.output
