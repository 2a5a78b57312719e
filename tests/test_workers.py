"""Intake in worker processes (docs/design.md "Process shape"): ``controlroom.server.run``
with ``ingestion.workers`` = 1 starts a worker at the configured niceness, restarts it when
it is killed without losing a message, stops it at the stop, and its metrics and health
reach the API process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from controlroom import server, workers
from controlroom.config import IngestionSettings, Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.tables import event_log_items, failed_messages
from controlroom.runtime import file_locks, intake_cgroup
from controlroom.runtime.reads_first import CountReads
from controlroom.runtime.sockets import listen
from controlroom.sitecalls.history import KpiSampler
from controlroom.transport import create_transport
from controlroom.transport.embedded import DEFAULT_LEASE_SECONDS
from controlroom.workers import merged_exposition
from tests.factories import at
from tests.nsb import failed_headers
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.sitecalls import packets as factory

TIMEOUT = 120.0
NICE = 7


@pytest.fixture
def worker_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"ingestion": IngestionSettings(workers=1, nice=NICE, batch_size=20)}
    )


def children() -> set[int]:
    """The ids of this process's worker processes (Linux /proc: the children started by
    multiprocessing's spawn, not its resource tracker)."""
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread or a child that just ended
            for pid in (task / "children").read_text().split():
                if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.add(int(pid))
    return found


def niceness(pid: int) -> int:
    """Field 19 of /proc/<pid>/stat (after the parenthesised command name)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


def of_backends(url: str, read: Callable[[int], int]) -> list[int]:
    """``read`` of each PostgreSQL backend connected to ``url``'s database (the server
    runs on this machine), this query's own included, read while it is connected; a
    backend that ended meanwhile is left out."""
    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            pids = conn.execute(
                sa.text("SELECT pid FROM pg_stat_activity WHERE datname = :d"),
                {"d": sa.make_url(url).database},
            ).scalars()
            found = []
            for pid in pids:
                with contextlib.suppress(OSError):
                    found.append(read(pid))
            return found
    finally:
        engine.dispose()


def stored_count(settings: Settings) -> int:
    engine = create_store_engine(settings.effective_database_url)
    try:
        with engine.connect() as conn:
            count = sa.select(sa.func.count()).select_from(failed_messages)
            return int(conn.execute(count).scalar_one())
    finally:
        engine.dispose()


async def publish(settings: Settings, first: int, count: int) -> None:
    transport = create_transport(settings)
    await transport.start()
    try:
        for n in range(first, first + count):
            headers = failed_headers(f"worker-test-{n}")
            await transport.publish(settings.error_queue, headers, b'{"n": %d}' % n)
    finally:
        await transport.close()


async def until(condition: Callable[[], Awaitable[bool]]) -> None:
    while not await condition():
        await asyncio.sleep(0.1)


def serve(settings: Settings, body: Callable[[str], Awaitable[None]]) -> set[int]:
    """Run the service, call ``body`` with its URL, stop it; answers the child processes
    left afterwards."""

    async def main() -> None:
        seen: list[server.Serving] = []
        stop = asyncio.Event()
        with listen("127.0.0.1", 0) as listener:
            running = asyncio.create_task(
                server.run(settings, listener=listener, stop=stop, on_serving=seen.append)
            )
            async with asyncio.timeout(TIMEOUT):
                await until(lambda: asyncio.sleep(0, bool(seen)))
                try:
                    await body(seen[0].url)
                finally:
                    stop.set()
                    await running

    before = children()
    asyncio.run(main())
    return children() - before


@pytest.mark.rabbitmq
def test_a_killed_worker_is_started_again_at_its_niceness_and_loses_no_message(
    worker_settings: Settings, rabbitmq_url: str
) -> None:
    # On RabbitMQ, whose redelivery of a dead consumer's messages is immediate; the
    # embedded queue gives them back when their lease expires (minutes).
    worker_settings = worker_settings.model_copy(update={"broker_url": rabbitmq_url})
    pids: list[int] = []
    others = children()  # another test's workers this process has not reaped yet

    def ours() -> set[int]:
        return children() - others

    async def body(url: str) -> None:
        await until(lambda: asyncio.sleep(0, bool(ours())))
        first = ours().pop()
        pids.append(first)
        await publish(worker_settings, 0, 200)
        await until(lambda: asyncio.to_thread(lambda: stored_count(worker_settings) > 0))
        # It stores only once it has lowered its priority.
        assert niceness(first) == os.getpriority(os.PRIO_PROCESS, 0) + NICE
        os.kill(first, signal.SIGKILL)
        await publish(worker_settings, 200, 200)
        await until(lambda: asyncio.sleep(0, bool(ours() - {first})))
        pids.append((ours() - {first}).pop())
        await until(lambda: asyncio.to_thread(lambda: stored_count(worker_settings) == 400))

    left = serve(worker_settings, body)
    assert left == set()  # the stop ended the worker
    assert pids[0] != pids[1]
    assert stored_count(worker_settings) == 400


@pytest.mark.rabbitmq
def test_without_workers_an_intake_whose_queue_is_deleted_consumes_it_again(
    settings: Settings, rabbitmq_url: str
) -> None:
    """Breaker pass: with ``ingestion.workers = 0`` a consumer RabbitMQ cancelled (its
    queue deleted) stopped serve, where a worker process would have been started again.
    The in-process intake now consumes again, declaring the queue, and serve runs on."""
    settings = settings.model_copy(
        update={
            "broker_url": rabbitmq_url,
            "error_queue": f"error-{uuid.uuid4().hex[:8]}",
            "ingestion": IngestionSettings(workers=0, batch_size=20),
        }
    )

    async def body(url: str) -> None:
        await publish(settings, 0, 1)
        await until(lambda: asyncio.to_thread(lambda: stored_count(settings) == 1))
        connection = await aio_pika.connect(rabbitmq_url)
        async with connection:
            channel = await connection.channel()
            await channel.queue_delete(settings.error_queue)

            async def consumed_again() -> bool:
                probe = await connection.channel()  # a passive declare of a missing queue
                try:  # closes its channel
                    queue = await probe.declare_queue(settings.error_queue, passive=True)
                    return bool(queue.declaration_result.consumer_count)
                except aio_pika.exceptions.ChannelNotFoundEntity:
                    return False
                finally:
                    if not probe.is_closed:
                        await probe.close()

            await until(consumed_again)
        # Consuming again, with nothing to store: health is ok (breaker pass, third: it
        # said "writes failing" until a message was next stored, for ever when idle).
        async with httpx.AsyncClient(timeout=TEST_CLIENT_TIMEOUT) as client:
            health = await client.get(f"{url}/api/health")
        assert health.json()["intake"] == "ok", health.json()
        await publish(settings, 1, 1)
        await until(lambda: asyncio.to_thread(lambda: stored_count(settings) == 2))

    serve(settings, body)


def attempts_by_message(settings: Settings) -> dict[str, int]:
    engine = create_store_engine(settings.effective_database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(
                    failed_messages.c.message_id, failed_messages.c.number_of_processing_attempts
                )
            )
            return {row.message_id: row.number_of_processing_attempts for row in rows}
    finally:
        engine.dispose()


@pytest.mark.rabbitmq
def test_two_workers_on_one_queue_count_every_attempt_exactly_once_across_a_kill(
    worker_settings: Settings, rabbitmq_url: str
) -> None:
    """Several workers keep the write path's rules (docs/design.md "Process shape"): the
    attempts of one message, shuffled across both workers and redelivered after one is
    killed, fold into one row counting each attempt once."""
    settings = worker_settings.model_copy(
        update={
            "broker_url": rabbitmq_url,
            "ingestion": IngestionSettings(workers=2, nice=NICE, batch_size=10),
        }
    )
    messages, attempts = 30, 3
    deliveries = [(f"several-{n}", attempt) for n in range(messages) for attempt in range(attempts)]
    deliveries += deliveries[::4]  # some attempts delivered twice, as a redelivery does
    random.Random(7).shuffle(deliveries)
    others = children()

    async def publish_attempts(part: list[tuple[str, int]]) -> None:
        transport = create_transport(settings)
        await transport.start()
        try:
            for message_id, attempt in part:
                headers = failed_headers(message_id, failed_at=at(attempt))
                await transport.publish(settings.error_queue, headers, b"{}")
        finally:
            await transport.close()

    def total() -> int:
        return sum(attempts_by_message(settings).values())

    async def body(url: str) -> None:
        await until(lambda: asyncio.sleep(0, len(children() - others) == 2))
        half = len(deliveries) // 2
        await publish_attempts(deliveries[:half])
        await until(lambda: asyncio.to_thread(lambda: total() > 0))
        os.kill(min(children() - others), signal.SIGKILL)
        await publish_attempts(deliveries[half:])
        await until(lambda: asyncio.to_thread(lambda: total() >= messages * attempts))
        await asyncio.sleep(1.0)  # a double count would land now

    serve(settings, body)
    assert attempts_by_message(settings) == {f"several-{n}": attempts for n in range(messages)}


def test_a_killed_workers_embedded_queue_claims_come_back_at_once(
    worker_settings: Settings,
) -> None:
    """Serve gives back what a dead worker held in the embedded queue when it restarts it:
    the rest is stored well before the claims' lease (``DEFAULT_LEASE_SECONDS``) runs
    out."""
    assert DEFAULT_LEASE_SECONDS > TIMEOUT  # else the lease alone would pass this test
    settings = worker_settings.model_copy(
        update={"ingestion": IngestionSettings(workers=1, nice=NICE, batch_size=500)}
    )
    others = children()

    async def body(url: str) -> None:
        await until(lambda: asyncio.sleep(0, bool(children() - others)))
        first = (children() - others).pop()
        await publish(settings, 0, 3000)
        await until(lambda: asyncio.to_thread(lambda: stored_count(settings) > 0))
        os.kill(first, signal.SIGKILL)
        await until(lambda: asyncio.to_thread(lambda: stored_count(settings) == 3000))

    serve(settings, body)
    assert stored_count(settings) == 3000


def test_health_is_degraded_from_a_workers_end_until_its_successor_has_run(
    worker_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that ended (a crash, a kill) degrades its intakes' health, with an empty
    queue too: nothing else would show an intake whose worker fails in a loop. The health
    is ok again once the worker started after it has run ``RESTART_RESET_SECONDS``."""
    monkeypatch.setattr(workers, "RESTART_RESET_SECONDS", 2.0)
    others = children()
    answers: list[dict[str, object]] = []

    async def body(url: str) -> None:
        await until(lambda: asyncio.sleep(0, bool(children() - others)))
        first = (children() - others).pop()
        async with httpx.AsyncClient(base_url=url, timeout=TEST_CLIENT_TIMEOUT) as client:

            async def health(degraded: bool) -> bool:
                answer = await client.get("/api/health")
                answers.append({"status": answer.status_code, **answer.json()})
                return answer.json()["intake"].startswith("degraded") == degraded

            await until(lambda: health(False))
            os.kill(first, signal.SIGKILL)
            await until(lambda: health(True))
            await until(lambda: health(False))

    serve(worker_settings, body)
    degraded = [answer for answer in answers if answer["status"] == 503]
    assert degraded, answers
    intake = str(degraded[0]["intake"])
    assert "error queue intake: intake worker 0 ended (exit code -9)" in intake
    assert "telemetry intake: intake worker 0 ended (exit code -9)" in intake
    assert answers[-1]["status"] == 200


def test_the_workers_metrics_and_health_reach_the_api(worker_settings: Settings) -> None:
    answers: dict[str, str] = {}

    async def body(url: str) -> None:
        await publish(worker_settings, 0, 30)
        async with httpx.AsyncClient(base_url=url, timeout=TEST_CLIENT_TIMEOUT) as client:

            async def scraped() -> bool:
                answers["metrics"] = (await client.get("/metrics")).text
                return 'worker="0"' in answers["metrics"] and stored_count(worker_settings) == 30

            await until(scraped)
            await asyncio.sleep(1.5)  # the worker's next snapshot holds the last batch
            answers["metrics"] = (await client.get("/metrics")).text
            answers["health"] = (await client.get("/api/health")).text

    serve(worker_settings, body)
    ingested = [
        line
        for line in answers["metrics"].splitlines()
        if line.startswith("controlroom_ingested_messages_total{") and 'worker="0"' in line
    ]
    assert ingested and sum(float(line.rsplit(" ", 1)[1]) for line in ingested) == 30
    intakes = json.loads(answers["health"])["details"]["intakes"]
    assert intakes["error queue intake"]["last_stored_at"] is not None


def waited_for_reads(metrics: str) -> float:
    """``controlroom_worker_waited_for_reads_seconds_total`` of worker 0 in ``metrics``."""
    for line in metrics.splitlines():
        name = "controlroom_worker_waited_for_reads_seconds_total{"
        if line.startswith(name) and 'worker="0"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def until_a_worker_waited_for_reads(url: str) -> None:
    """Until worker 0's statements have waited for serve's reads (serve's ``/metrics``)."""
    async with httpx.AsyncClient(base_url=url, timeout=TEST_CLIENT_TIMEOUT) as client:

        async def waited() -> bool:
            return waited_for_reads((await client.get("/metrics")).text) > 0

        await until(waited)


def test_at_the_stop_a_worker_no_longer_waits_for_reads(
    worker_settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Breaker's pass (session 31): with ``yield_to_reads`` 1 and a read that never ends
    (a client that never reads its answers), the worker's batches in hand waited through
    the stop's grace and the worker was killed: serve stops its workers before its HTTP
    server, so those reads end only after them. At the stop the batches go first."""
    reads = workers.ReadsInFlight.shared(multiprocessing.get_context("spawn"))
    monkeypatch.setattr(workers.ReadsInFlight, "shared", lambda context: reads)
    reads.add(1)
    waiting = worker_settings.model_copy(
        update={
            "ingestion": worker_settings.ingestion.model_copy(
                update={"yield_to_reads": 1.0, "stop_grace_seconds": 5.0}
            )
        }
    )

    async def body(url: str) -> None:
        await publish(waiting, 0, 5)
        await until_a_worker_waited_for_reads(url)
        assert stored_count(waiting) == 0

    with caplog.at_level(logging.ERROR, logger=workers.__name__):
        serve(waiting, body)
    assert not [r for r in caplog.records if "did not stop" in r.getMessage()]
    assert stored_count(waiting) == 5


def test_a_workers_intake_waits_while_serve_answers_a_read(
    worker_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Serve counts its reads in memory its workers share, and a worker's store statements
    wait for them (docs/decisions.md "Reads first: the workers wait for serve's reads").
    The count serve shares is the test's, holding one read that never ends; with
    ``yield_to_reads`` 1 the intake waits as long as it is there."""
    reads = workers.ReadsInFlight.shared(multiprocessing.get_context("spawn"))
    monkeypatch.setattr(workers.ReadsInFlight, "shared", lambda context: reads)
    reads.add(1)
    during: list[int] = []

    class Counting(CountReads):  # what serve's app sees of the count while it answers
        def __init__(self, app: Any, counted: workers.ReadsInFlight, **kwargs: Any) -> None:
            async def seen(scope: Any, receive: Any, send: Any) -> None:
                during.append(counted.count)
                await app(scope, receive, send)

            super().__init__(seen, counted, **kwargs)

    monkeypatch.setattr(server, "CountReads", Counting)
    waiting = worker_settings.model_copy(
        update={"ingestion": worker_settings.ingestion.model_copy(update={"yield_to_reads": 1.0})}
    )
    stored: list[int] = []

    async def body(url: str) -> None:
        await publish(waiting, 0, 5)
        await until_a_worker_waited_for_reads(url)
        stored.append(stored_count(waiting))
        reads.add(-1)
        await until(lambda: asyncio.sleep(0, stored_count(waiting) == 5))
        during.clear()
        async with httpx.AsyncClient(base_url=url, timeout=TEST_CLIENT_TIMEOUT) as client:
            await client.get("/api/endpoints")

    serve(waiting, body)
    assert stored == [0]
    assert during == [1]  # serve counted its read in the count its worker waits on
    assert reads.count == 0


def intake_events(settings: Settings) -> list[str]:
    engine = create_store_engine(settings.effective_database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(event_log_items.c.event_type, event_log_items.c.related_to_json)
                .where(event_log_items.c.category == "Ingestion")
                .order_by(event_log_items.c.raised_at)
            ).all()
            return [f"{row.event_type} {row.related_to_json}" for row in rows]
    finally:
        engine.dispose()


def test_serve_writes_the_stall_and_recovery_of_a_workers_intake(
    worker_settings: Settings, engine: sa.Engine
) -> None:
    """A worker's intake reports to serve, and serve writes its changes to the event log:
    the telemetry intake's writes fail (its table is gone), then succeed again."""
    settings = worker_settings.model_copy(
        update={
            "ingestion": worker_settings.ingestion.model_copy(
                update={"report_interval_seconds": 0.1, "max_backoff_seconds": 0.1}
            )
        }
    )
    where = json.dumps([f"/queue/{settings.telemetry_queue}"])
    with engine.begin() as conn:  # the worker's telemetry writes fail
        conn.exec_driver_sql("ALTER TABLE site_calls RENAME TO site_calls_away")

    async def body(url: str) -> None:
        transport = create_transport(settings)
        await transport.start()
        try:
            packet = factory.packet("Attempted", op_id=str(uuid.uuid4()))
            await transport.publish(settings.telemetry_queue, {}, json.dumps(packet).encode())
        finally:
            await transport.close()
        stalled = f"IntakeStalled {where}"
        await until(lambda: asyncio.to_thread(lambda: stalled in intake_events(settings)))
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE site_calls_away RENAME TO site_calls")
        recovered = f"IntakeRecovered {where}"
        await until(lambda: asyncio.to_thread(lambda: recovered in intake_events(settings)))

    serve(settings, body)
    assert intake_events(settings) == [f"IntakeStalled {where}", f"IntakeRecovered {where}"]


def test_sigterm_stops_every_worker(worker_settings: Settings) -> None:
    settings = worker_settings.model_copy(
        update={"ingestion": IngestionSettings(workers=2, nice=NICE)}
    )

    others = children()  # another test's workers this process has not reaped yet

    async def body(url: str) -> None:
        await until(lambda: asyncio.sleep(0, len(children() - others) == 2))

    assert serve(settings, body) == set()


def test_a_part_that_stops_on_its_own_stops_the_workers_too(
    worker_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def returns(self: KpiSampler) -> None:
        await asyncio.sleep(0.5)

    monkeypatch.setattr(KpiSampler, "run", returns)
    others = children()

    async def main() -> None:
        async with asyncio.timeout(TIMEOUT):
            with listen("127.0.0.1", 0) as listener:
                await server.run(worker_settings, listener=listener)

    with pytest.raises(server.PartStopped, match="KPI sampler stopped"):
        asyncio.run(main())
    assert children() - others == set(), "a worker outlived the serve that started it"


def test_merged_exposition_labels_each_workers_series() -> None:
    own = '# HELP a_total A\n# TYPE a_total counter\na_total{q="e"} 1.0\n'
    worker = own.replace(" 1.0", " 5.0") + "# HELP b B\n# TYPE b gauge\nb 2.0\n"
    text = merged_exposition(own, {0: worker, 1: worker}).decode()
    assert 'a_total{q="e"} 1.0' in text
    assert 'a_total{q="e",worker="0"} 5.0' in text
    assert 'a_total{q="e",worker="1"} 5.0' in text
    assert 'b{worker="1"} 2.0' in text
    assert text.count("# TYPE a_total counter") == 1


def test_a_family_only_workers_count_is_not_shown_unlabelled_from_serve() -> None:
    """Fresh-user pass (fifth): serve's own ``..._waited_for_reads_seconds_total 0.0``
    stood unlabelled beside the workers' series (serve never waits for its own reads)."""
    family = "controlroom_worker_waited_for_reads_seconds"
    own = f"# HELP {family} W\n# TYPE {family} counter\n{family}_total 0.0\n"
    worker = own.replace(" 0.0", " 2.5")
    text = merged_exposition(own, {0: worker}).decode()
    assert f'{family}_total{{worker="0"}} 2.5' in text
    assert f"{family}_total 0.0" not in text


def test_serve_shows_no_empty_batch_histogram_of_its_own_beside_the_workers() -> None:
    """Fresh user's pass (session 31): with intake in workers, serve's own
    ``controlroom_ingestion_batch_seconds_count 0.0`` stood unlabelled beside the
    workers' series (serve writes no batch then)."""
    family = "controlroom_ingestion_batch_seconds"
    own = (
        f"# HELP {family} B\n# TYPE {family} histogram\n"
        f'{family}_bucket{{le="+Inf"}} 0.0\n{family}_count 0.0\n{family}_sum 0.0\n'
    )
    worker = own.replace(" 0.0", " 3.0")
    text = merged_exposition(own, {0: worker}).decode()
    assert f'{family}_count{{worker="0"}} 3.0' in text
    assert f"{family}_count 0.0" not in text


@pytest.mark.postgresql
def test_the_postgresql_backends_of_a_worker_run_at_its_niceness(
    tmp_path: Path, postgresql_url: str
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=postgresql_url,
        ingestion=IngestionSettings(workers=1, nice=NICE),
    )
    reniced: list[int] = []

    def backends_at_nice() -> list[int]:
        return [nice for nice in of_backends(postgresql_url, niceness) if nice == NICE]

    async def body(url: str) -> None:
        await publish(settings, 0, 10)
        await until(lambda: asyncio.to_thread(lambda: stored_count(settings) == 10))
        reniced.extend(await asyncio.to_thread(backends_at_nice))

    serve(settings, body)
    assert reniced  # the worker's, and only a worker's are lowered


@pytest.mark.postgresql
def test_idle_scheduling_puts_the_worker_and_its_postgresql_backends_under_sched_idle(
    tmp_path: Path, postgresql_url: str
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=postgresql_url,
        ingestion=IngestionSettings(workers=1, nice=NICE, scheduling="idle"),
    )
    policies: dict[str, list[int]] = {}

    def backend_policies() -> list[int]:
        return of_backends(postgresql_url, os.sched_getscheduler)

    async def body(url: str) -> None:
        await publish(settings, 0, 10)
        await until(lambda: asyncio.to_thread(lambda: stored_count(settings) == 10))
        policies["workers"] = [os.sched_getscheduler(pid) for pid in children()]
        policies["backends"] = await asyncio.to_thread(backend_policies)

    serve(settings, body)
    assert policies["workers"] == [os.SCHED_IDLE]
    assert os.SCHED_IDLE in policies["backends"]  # the worker's
    assert os.SCHED_OTHER in policies["backends"]  # this test's own stays normal
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


@pytest.mark.parametrize("configured_by", ["environment", "settings file"])
def test_sigterm_to_controlroom_serve_stops_its_workers(tmp_path: Path, configured_by: str) -> None:
    """Set from the environment or from a settings file (whose settings must reach the
    worker processes as well: they travel pickled)."""
    env = {**os.environ, "CONTROLROOM_DATA_DIR": str(tmp_path / "data")}
    command = [str(Path(sys.executable).with_name("controlroom")), "serve", "--port", "0"]
    if configured_by == "environment":
        env["CONTROLROOM_INGESTION__WORKERS"] = "2"
    else:
        settings_file = tmp_path / "controlroom.toml"
        settings_file.write_text("[ingestion]\nworkers = 2\n")
        command += ["--config", str(settings_file)]
    serve_process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        workers = asyncio.run(_workers_of(serve_process.pid, 2))
        serve_process.send_signal(signal.SIGTERM)
        assert serve_process.wait(timeout=TIMEOUT) == 0
    finally:
        if serve_process.poll() is None:
            serve_process.kill()
            serve_process.wait()
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


async def _workers_of(pid: int, count: int) -> set[int]:
    found: set[int] = set()

    async def started() -> bool:
        found.clear()
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                for child in (task / "children").read_text().split():
                    if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                        found.add(int(child))
        return len(found) == count

    async with asyncio.timeout(TIMEOUT):
        await until(started)
    return set(found)


@pytest.mark.postgresql
@pytest.mark.parametrize(("switch", "warnings"), [("1\n", 1), ("0\n", 0)])
def test_lowering_local_backends_warns_once_when_the_kernels_autogroup_voids_their_nice(
    tmp_path: Path,
    postgresql_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    switch: str,
    warnings: int,
) -> None:
    sysctl = tmp_path / "sched_autogroup_enabled"
    sysctl.write_text(switch)
    monkeypatch.setattr(workers, "AUTOGROUP_SYSCTL", sysctl)
    engine = create_store_engine(postgresql_url)
    try:
        workers._lower_backends(engine, 1, "normal")
        with (
            caplog.at_level(logging.WARNING, logger=workers.__name__),
            engine.connect(),
            engine.connect(),  # two backends
        ):
            nices = of_backends(postgresql_url, niceness)  # theirs and its own
    finally:
        engine.dispose()
    assert sorted(nices) == [min(nices), min(nices) + 1, min(nices) + 1]  # both lowered
    said = [r for r in caplog.records if "autogroup" in r.getMessage()]
    assert len(said) == warnings
    assert all("sched_autogroup_enabled=0" in r.getMessage() for r in said)
    # ... and the other way out (fresh-user pass, sixth: the warning named only the sysctl).
    assert all(
        "or give intake a cgroup (ingestion.cpu_cgroup, or ingestion.own_cgroup" in r.getMessage()
        for r in said
    )


def test_autogroup_says_nothing_where_the_kernel_has_no_switch(tmp_path: Path) -> None:
    assert workers.autogroup_warning(tmp_path / "absent") is None


# -- ingestion.cpu_cgroup (docs/decisions.md "Intake's own cgroup escapes autogroup") ---


def _cgroup_root() -> Path | None:
    """A cgroup hierarchy this user may make a cgroup in: cgroup v1's cpu controller, or
    the unified hierarchy."""
    for root in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")):
        if (root / "cgroup.procs").is_file() and os.access(root, os.W_OK):
            return root
    return None


@pytest.fixture
def cpu_cgroup() -> Iterator[Path]:
    """A new cgroup, removed afterwards (what is left in it moved back to its parent)."""
    root = _cgroup_root()
    if root is None:
        pytest.skip("needs a cgroup hierarchy this user may make a cgroup in (root)")
    group = root / f"controlroom-test-{uuid.uuid4().hex[:12]}"
    group.mkdir()
    try:
        yield group
    finally:
        for _ in range(100):  # a backend ends a moment after its connection closes
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # ended meanwhile
                    (root / "cgroup.procs").write_text(f"{pid}\n")
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def cgroup_members(group: Path) -> set[int]:
    return {int(pid) for pid in (group / "cgroup.procs").read_text().split()}


def test_a_worker_joins_the_intake_cgroup_and_serve_stays_out(
    worker_settings: Settings, cpu_cgroup: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """And says so (fresh-user pass, sixth: a join was seen only in ``cgroup.procs``)."""
    settings = worker_settings.model_copy(
        update={
            "ingestion": worker_settings.ingestion.model_copy(update={"cpu_cgroup": cpu_cgroup})
        }
    )
    seen: dict[str, set[int]] = {}

    async def body(url: str) -> None:
        await publish(settings, 0, 10)
        await until(lambda: asyncio.to_thread(lambda: stored_count(settings) == 10))
        seen["members"] = cgroup_members(cpu_cgroup)
        seen["workers"] = children()

    serve(settings, body)
    assert seen["workers"]
    assert seen["workers"] <= seen["members"]
    assert os.getpid() not in seen["members"]
    assert f"worker-0 controlroom.workers: joined intake's cgroup {cpu_cgroup}" in (
        capfd.readouterr().err
    )


@pytest.mark.postgresql
def test_the_postgresql_backends_of_a_worker_join_the_intake_cgroup(
    tmp_path: Path, postgresql_url: str, cpu_cgroup: Path
) -> None:
    """Only the worker's, which it lowered: serve's own backends (its reads) stay out."""
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=postgresql_url,
        ingestion=IngestionSettings(workers=1, nice=NICE, cpu_cgroup=cpu_cgroup),
    )
    seen: dict[str, set[int]] = {}

    def lowered() -> set[int]:
        return set(of_backends(postgresql_url, lambda pid: pid if niceness(pid) == NICE else 0))

    async def body(url: str) -> None:
        await publish(settings, 0, 10)
        await until(lambda: asyncio.to_thread(lambda: stored_count(settings) == 10))
        seen["lowered before"] = await asyncio.to_thread(lowered) - {0}
        seen["members"] = cgroup_members(cpu_cgroup)
        seen["workers"] = children()
        seen["lowered after"] = await asyncio.to_thread(lowered) - {0}

    serve(settings, body)
    backends = seen["members"] - seen["workers"]
    assert seen["lowered before"]  # the worker's
    assert seen["lowered before"] <= backends <= seen["lowered after"]


@pytest.mark.postgresql
def test_lowering_into_a_cgroup_says_nothing_of_autogroup(
    tmp_path: Path,
    postgresql_url: str,
    cpu_cgroup: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The cgroup takes the backends out of their server's autogroup: the warning that
    their nice is void would be wrong."""
    sysctl = tmp_path / "sched_autogroup_enabled"
    sysctl.write_text("1\n")
    monkeypatch.setattr(workers, "AUTOGROUP_SYSCTL", sysctl)
    engine = create_store_engine(postgresql_url)
    try:
        workers._lower_backends(engine, 1, "normal", cpu_cgroup)
        with caplog.at_level(logging.WARNING, logger=workers.__name__), engine.connect():
            joined = cgroup_members(cpu_cgroup)
    finally:
        engine.dispose()
    assert len(joined) == 1
    assert not [r for r in caplog.records if "autogroup" in r.getMessage()]


@pytest.mark.postgresql
def test_a_cgroup_the_backends_cannot_join_leaves_their_nice_and_says_which_step_failed(
    tmp_path: Path,
    postgresql_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Breaker's pass (session 30): intake's cgroup removed under serve, a restarted
    worker said "the store's backends keep their priority" although it had reniced them,
    and kept back the autogroup warning that then applies."""
    sysctl = tmp_path / "sched_autogroup_enabled"
    sysctl.write_text("1\n")
    monkeypatch.setattr(workers, "AUTOGROUP_SYSCTL", sysctl)
    gone = tmp_path / "removed-cgroup"
    engine = create_store_engine(postgresql_url)
    try:
        workers._lower_backends(engine, NICE, "normal", gone)
        with caplog.at_level(logging.INFO, logger=workers.__name__), engine.connect() as conn:
            pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            nice = niceness(pid)
    finally:
        engine.dispose()
    said = " ".join(caplog.messages)
    assert nice >= NICE
    assert "keep their priority" not in said
    assert f"could not join intake's cgroup {gone}" in said
    assert "autogroup" in said


# -- intake's cgroup made by serve (runtime.intake_cgroup) ----------------------------------


def _cgroup_place() -> Path:
    """Where serve (this process, in these tests) makes intake's cgroup; skips where the
    kernel does not let it (not root, no delegated cgroup)."""
    place = intake_cgroup.find_place()
    if isinstance(place, str):
        pytest.skip(f"serve cannot make intake's cgroup here: {place}")
    return place.directory


def _serves_cgroup(place: Path) -> Path | None:
    """The cgroup serve (this process) made in ``place``, if any."""
    made = list(place.glob(f"{intake_cgroup.PREFIX}{os.getpid()}-*"))
    assert len(made) <= 1, made
    return made[0] if made else None


def _sample(metrics: str, name: str) -> float:
    """The one unlabelled sample ``name`` of a Prometheus text exposition."""
    (value,) = (
        s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
        if s.name == name and not s.labels
    )
    return value


def test_serve_makes_intake_a_cgroup_whose_weight_follows_the_reads_and_removes_it_at_stop(
    worker_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without ingestion.cpu_cgroup, intake's cgroup is made where serve may: the workers
    join it, serve stays out; it weighs the least the kernel takes while serve answers a
    read, and as a nice-0 process otherwise (docs/decisions.md "Intake's own cgroup
    escapes autogroup", "Intake's weight follows the reads")."""
    caplog.set_level(logging.INFO, logger=intake_cgroup.__name__)
    place = _cgroup_place()
    settings = worker_settings  # ingestion.own_cgroup is on by default
    seen: dict[str, Any] = {}

    def weight() -> dict[str, str]:
        made = seen["made"]
        return {
            name: (made / name).read_text().strip()
            for name in ("cpu.shares", "cpu.weight")
            if (made / name).exists()
        }

    class Weighing(CountReads):  # what intake's cgroup weighs while serve answers a read
        def __init__(self, app: Any, counted: workers.ReadsInFlight, **kwargs: Any) -> None:
            async def seen_during(scope: Any, receive: Any, send: Any) -> None:
                if scope["path"] == "/api/endpoints":
                    seen["during a read"] = weight()
                await app(scope, receive, send)

            super().__init__(seen_during, counted, **kwargs)

    monkeypatch.setattr(server, "CountReads", Weighing)

    async def body(url: str) -> None:
        await publish(settings, 0, 10)
        await until(lambda: asyncio.to_thread(lambda: stored_count(settings) == 10))
        seen["made"] = made = _serves_cgroup(place)
        assert made is not None
        seen["members"] = cgroup_members(made)
        seen["workers"] = children()
        async with httpx.AsyncClient(base_url=url, timeout=TEST_CLIENT_TIMEOUT) as client:
            await client.get("/api/endpoints")
        # The answer reaches the client a moment before the read ends in serve.
        idle = ({"cpu.shares": "1024"}, {"cpu.weight": "100"})
        await until(lambda: asyncio.sleep(0, weight() in idle))
        seen["after"] = weight()
        async with httpx.AsyncClient(base_url=url, timeout=TEST_CLIENT_TIMEOUT) as client:
            seen["metrics"] = (await client.get("/metrics")).text

    serve(settings, body)
    made = seen["made"]
    assert re.fullmatch(rf"{intake_cgroup.PREFIX}{os.getpid()}-[0-9a-f]{{8}}", made.name)
    assert seen["workers"]
    assert seen["workers"] <= seen["members"]
    assert os.getpid() not in seen["members"]
    assert seen["during a read"] in ({"cpu.shares": "2"}, {"cpu.weight": "1"}), seen
    assert seen["after"] in ({"cpu.shares": "1024"}, {"cpu.weight": "100"}), seen
    lowered = _sample(seen["metrics"], "controlroom_intake_weight_lowered_seconds_total")
    assert 0 < lowered <= _sample(seen["metrics"], "controlroom_intake_weight_reads_seconds_total")
    assert not made.exists()
    assert f"joined intake's cgroup {made}" in capfd.readouterr().err
    assert f"intake's cgroup {made} removed" in caplog.messages
    made_lines = {
        f"intake's cgroup {made} made, {name} {low} while serve answers a read (for at most "
        f"0.2 of the time: ingestion.yield_to_reads), {high} otherwise"
        for name, low, high in (("cpu.shares", 2, 1024), ("cpu.weight", 1, 100))
    }
    assert made_lines & set(caplog.messages), caplog.messages


def test_serve_makes_no_cgroup_when_own_cgroup_is_off(worker_settings: Settings) -> None:
    """The operator's choice: intake keeps the nice alone."""
    place = _cgroup_place()
    settings = worker_settings.model_copy(
        update={"ingestion": worker_settings.ingestion.model_copy(update={"own_cgroup": False})}
    )
    seen: dict[str, bool] = {}

    async def body(url: str) -> None:
        await publish(settings, 0, 1)
        await until(lambda: asyncio.to_thread(lambda: stored_count(settings) == 1))
        seen["made"] = _serves_cgroup(place) is not None

    serve(settings, body)
    assert seen == {"made": False}


def test_serve_removes_the_cgroups_an_ended_serve_of_its_data_directory_left_and_no_other(
    worker_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """A serve killed with -9 leaves its cgroup; the next serve of its data directory
    removes it, and says so, first moving to its own cgroup what is still in it (breaker's
    pass, session 32: a killed worker's PostgreSQL sessions waiting on a lock kept it to a
    third serve). Nothing else is touched: a cgroup whose record a running serve holds,
    one without a record (another data directory's, or not serve's). The breaker's pass
    (session 31): a serve in a PID namespace of its own took live serves' cgroups for
    ended ones, by their process ids and by a ``cgroup.procs`` that looks empty from
    inside the namespace; the record's lock is what tells."""
    caplog.set_level(logging.INFO, logger=intake_cgroup.__name__)
    place = _cgroup_place()
    records = worker_settings.data_dir / intake_cgroup.RECORDS
    records.mkdir(parents=True)
    prefix = f"{intake_cgroup.PREFIX}{os.getpid()}"
    left, live, busy, other, copied = (
        place / f"{prefix}0-{name}" for name in ("left", "live", "busy", "other", "copied")
    )
    for group in (left, live, busy, other, copied):
        group.mkdir()
    for group in (left, live, busy):
        (records / group.name).write_text(intake_cgroup.record_text(group, records))
    # A record copied with a data directory (a backup restored beside the live serve):
    # it names a live serve's cgroup, but its records directory is not this one.
    elsewhere = worker_settings.data_dir.parent / "original"
    elsewhere.mkdir()
    (records / copied.name).write_text(intake_cgroup.record_text(copied, elsewhere))
    sleeper = subprocess.Popen(["sleep", "60"])  # a process in the busy one
    (busy / "cgroup.procs").write_text(f"{sleeper.pid}\n")
    live_worker = subprocess.Popen(["sleep", "60"])  # the live serve's worker in the copied one
    (copied / "cgroup.procs").write_text(f"{live_worker.pid}\n")
    try:
        with (records / live.name).open("a") as held:
            file_locks.hold(held)  # a running serve's record

            async def body(url: str) -> None:
                pass

            serve(worker_settings, body)
        assert not left.exists() and not (records / left.name).exists()
        assert f"removed intake's cgroup {left}, which an ended serve left" in caplog.messages
        assert live.exists() and (records / live.name).exists()
        assert other.exists()
        assert not busy.exists() and not (records / busy.name).exists()
        assert sleeper.poll() is None  # moved, not ended
        assert f"/{busy.name}" not in Path(f"/proc/{sleeper.pid}/cgroup").read_text()
        assert (
            f"removed intake's cgroup {busy}, which an ended serve left (its 1 process moved "
            "to serve's cgroup first)" in caplog.messages
        ), caplog.messages
        assert cgroup_members(copied) == {live_worker.pid}  # touched neither
        copy_said = (
            f"{records / copied.name} was recorded by another data directory's serve: "
            "left as it is"
        )
        assert copy_said in caplog.messages, caplog.messages
        assert sorted(p.name for p in records.iterdir()) == sorted([live.name, copied.name])
    finally:
        for process in (sleeper, live_worker):
            process.kill()
            process.wait()
            with contextlib.suppress(OSError):
                (place / "cgroup.procs").write_text(f"{process.pid}\n")
        for group in (left, live, busy, other, copied):
            with contextlib.suppress(FileNotFoundError, OSError):
                group.rmdir()


def test_a_cgroup_removed_under_serve_is_not_said_removed_by_serve(
    worker_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Breaker's pass (session 31): serve said "intake's cgroup ... removed" at its stop
    for one an operator had removed under it."""
    caplog.set_level(logging.INFO, logger=intake_cgroup.__name__)
    place = _cgroup_place()
    seen: dict[str, Path] = {}

    async def body(url: str) -> None:
        def joined() -> bool:
            made = _serves_cgroup(place)
            if made is not None and cgroup_members(made):
                seen["made"] = made
            return "made" in seen

        await until(lambda: asyncio.sleep(0, joined()))
        made = seen["made"]

        def removed() -> bool:  # a backend may join while its members are moved out
            for pid in cgroup_members(made):
                with contextlib.suppress(OSError):
                    (made.parent / "cgroup.procs").write_text(f"{pid}\n")
            try:
                made.rmdir()
            except OSError:
                return False
            return True

        await until(lambda: asyncio.sleep(0, removed()))

    serve(worker_settings, body)
    made = seen["made"]
    assert f"intake's cgroup {made} was removed under serve" in caplog.messages
    assert f"intake's cgroup {made} removed" not in caplog.messages


def test_where_serve_may_not_make_a_cgroup_it_says_why(tmp_path: Path) -> None:
    """cgroup v2 without cpu enabled below serve's cgroup (a systemd service without
    Delegate=): intake keeps the nice alone."""
    hierarchy = tmp_path / "unified"
    (hierarchy / "system.slice" / "controlroom.service").mkdir(parents=True)
    (hierarchy / "system.slice" / "controlroom.service" / "cgroup.subtree_control").write_text(
        "memory pids\n"
    )
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("0::/system.slice/controlroom.service\n")
    (proc / "mountinfo").write_text(
        f"30 23 0:26 / {hierarchy} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    assert intake_cgroup.find_place(proc) == (
        f"cpu is not enabled below serve's cgroup {hierarchy}/system.slice/controlroom.service "
        "(its cgroup.subtree_control)"
    )
    (proc / "cgroup").write_text("1:name=systemd:/\n")
    assert intake_cgroup.find_place(proc) == "serve is in no cgroup of the CPU controller"
