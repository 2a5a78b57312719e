"""Several intake workers on one queue keep the write path's rules (docs/design.md "Process
shape", "The conditional upsert", "Transient failures"), per provider, on the embedded
queue and on RabbitMQ:

- no reopening: with two workers taking the deliveries of one queue, a redelivered attempt
  already counted leaves a Resolved or Archived message as it was, whichever worker writes
  it and whatever it races with (the other worker's redelivery of the same attempt, a
  retry confirmation of the same message);
- SIGTERM drains: ``controlroom serve`` told to stop lets every batch its workers hold
  commit and be acknowledged; what no batch held goes back to the queue unwritten, so
  nothing is both stored and still queued, and nothing is lost.

Exact attempt counts across a worker's kill are in ``test_workers.py``; the kill -9 drain
with workers in ``integration/test_serve_sigkill_drain.py``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import pytest
import sqlalchemy as sa

from controlroom.config import IngestionSettings, Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors import actions
from controlroom.transport import create_transport
from tests.factories import at
from tests.nsb import failed_headers
from tests.refusing import writes_held
from tests.servers import TEST_CLIENT_TIMEOUT, rabbitmq_queue_counts
from tests.test_workers import TIMEOUT, children, serve, until

CONTROLROOM_EXE = Path(sys.executable).with_name("controlroom")

Deliveries = list[tuple[dict[str, str | None], bytes]]


@pytest.fixture(params=["embedded", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def broker_url(request: pytest.FixtureRequest) -> str | None:
    """The transport the test runs on (once per kind): ``None`` for the embedded queue,
    else a scratch RabbitMQ vhost."""
    if request.param == "embedded":
        return None
    return str(request.getfixturevalue("rabbitmq_url"))


@pytest.fixture
def on_transport(settings: Settings, broker_url: str | None) -> Settings:
    """``settings`` on the test's transport, with queues of their own (a RabbitMQ vhost
    outlives single tests)."""
    return settings.model_copy(
        update={
            "broker_url": broker_url,
            "error_queue": f"error-{uuid.uuid4().hex[:8]}",
            "telemetry_queue": f"telemetry-{uuid.uuid4().hex[:8]}",
        }
    )


async def publish(settings: Settings, deliveries: Deliveries) -> None:
    transport = create_transport(settings)
    await transport.start()
    try:
        for headers, body in deliveries:
            await transport.publish(settings.error_queue, headers, body)
    finally:
        await transport.close()


async def ready_in_queue(settings: Settings) -> int:
    """Messages of the error queue no consumer holds, as the transport counts them."""
    transport = create_transport(settings)
    await transport.start()
    try:
        return (await transport.queue_depth(settings.error_queue)).messages
    finally:
        await transport.close()


def queue_counts(settings: Settings) -> tuple[int, int]:
    """(ready, held by a consumer and not settled) messages of the error queue."""
    if settings.broker_url:
        return rabbitmq_queue_counts(settings.broker_url, settings.error_queue)
    with contextlib.closing(sqlite3.connect(settings.embedded_queue_path)) as conn:
        ready, held = conn.execute(
            "SELECT coalesce(sum(lease_expires_at <= ?), 0), coalesce(sum(lease_expires_at > ?), 0)"
            " FROM queue_messages WHERE queue = ?",
            (time.time(), time.time(), settings.error_queue),
        ).fetchone()
    return int(ready), int(held)


async def take_queued_message_ids(settings: Settings) -> list[str]:
    """The ``NServiceBus.MessageId`` of every message left in the error queue (no consumer
    may hold any); RabbitMQ's are taken out of the queue to be read."""
    if not settings.broker_url:
        with contextlib.closing(sqlite3.connect(settings.embedded_queue_path)) as conn:
            rows = conn.execute(
                "SELECT headers_json FROM queue_messages WHERE queue = ?", (settings.error_queue,)
            ).fetchall()
        return [json.loads(headers)["NServiceBus.MessageId"] for (headers,) in rows]
    taken: list[str] = []
    connection = await aio_pika.connect(settings.broker_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(settings.error_queue, passive=True)
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            value: Any = (message.headers or {})["NServiceBus.MessageId"]
            taken.append(value.decode() if isinstance(value, bytes) else str(value))
    return taken


def stored_rows(engine: sa.Engine) -> dict[str, sa.Row[Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                failed_messages.c.message_id,
                failed_messages.c.id,
                failed_messages.c.status,
                failed_messages.c.number_of_processing_attempts,
                failed_messages.c.status_changed_at,
                failed_messages.c.last_modified,
                failed_messages.c.last_failure_at,
            )
        ).all()
    return {row.message_id: row for row in rows}


INGESTED_LINE = re.compile(
    r'^controlroom_ingested_messages_total\{outcome="(\w+)",worker="(\d+)"\} (\S+)$', re.M
)


async def ingested_by_worker(client: httpx.AsyncClient) -> dict[str, int]:
    """Deliveries each worker took from the error queue (every outcome), by its index,
    from the last snapshot each sent to serve's ``/metrics``."""
    by_worker: dict[str, int] = {}
    for _outcome, worker, value in INGESTED_LINE.findall((await client.get("/metrics")).text):
        by_worker[worker] = by_worker.get(worker, 0) + int(float(value))
    return by_worker


def test_two_workers_never_reopen_a_resolved_or_archived_message_on_redelivery(
    on_transport: Settings, engine: sa.Engine
) -> None:
    """Every attempt of 40 messages stored; the operator archives a quarter and resolves a
    quarter; then every attempt is delivered twice more, shuffled across two workers,
    together with a new attempt of a third quarter (archived: it reopens, as a new failure
    must) and a retry confirmation of the last quarter (racing with the redeliveries of
    its own attempts)."""
    settings = on_transport.model_copy(
        update={"ingestion": IngestionSettings(workers=2, batch_size=5)}
    )
    names = [f"reopen-{n}" for n in range(40)]
    archived, resolved, failing_again, confirmed = (names[k::4] for k in range(4))
    attempts: Deliveries = [
        (failed_headers(name, failed_at=at(seconds)), b"{}") for name in names for seconds in (1, 2)
    ]
    rng = random.Random(26)
    seen: dict[str, Any] = {}
    others = children()

    async def body(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=TEST_CLIENT_TIMEOUT) as client:
            # Both workers consume (each sends its metrics once its intakes started).
            await until(lambda: asyncio.sleep(0, len(children() - others) == 2))
            await until(lambda: _both_report(client))
            await publish(settings, rng.sample(attempts, len(attempts)))
            await until(lambda: asyncio.to_thread(_all_counted, engine, names, 2))
            rows = await asyncio.to_thread(stored_rows, engine)
            to_archive = [str(rows[n].id) for n in archived + failing_again]
            to_resolve = [str(rows[n].id) for n in resolved]
            await asyncio.to_thread(actions.archive_messages, engine, to_archive, by="operator")
            await asyncio.to_thread(
                actions.resolve_pending_retries, engine, to_resolve, by="operator"
            )
            seen["before"] = await asyncio.to_thread(stored_rows, engine)
            await until(lambda: _ingested(client, len(attempts)))
            seen["phase one"] = await ingested_by_worker(client)

            again = attempts * 2
            again += [(failed_headers(n, failed_at=at(3)), b"{}") for n in failing_again]
            again += [(_confirmation(str(rows[n].id)), b"") for n in confirmed]
            await publish(settings, rng.sample(again, len(again)))
            drained = (0, 0)
            await until(lambda: asyncio.to_thread(lambda: queue_counts(settings) == drained))
            await until(lambda: _ingested(client, len(attempts) + len(again)))
            seen["phase two"] = await ingested_by_worker(client)

    serve(settings, body)
    before, after = seen["before"], stored_rows(engine)
    assert {before[n].status for n in archived} == {FailedMessageStatus.ARCHIVED}
    assert {before[n].status for n in resolved} == {FailedMessageStatus.RESOLVED}
    # Each worker took part in both phases (the premise: two writers on one queue).
    took = {w: seen["phase two"].get(w, 0) - seen["phase one"].get(w, 0) for w in ("0", "1")}
    assert all(took.values()), took
    for name in archived + resolved:  # redelivered only: nothing written
        assert after[name] == before[name], name
    for name in failing_again:  # a new attempt reopens
        assert after[name].status == FailedMessageStatus.UNRESOLVED, name
        assert after[name].number_of_processing_attempts == 3, name
    for name in confirmed:  # resolved by its confirmation, whatever came after it
        assert after[name].status == FailedMessageStatus.RESOLVED, name
        assert after[name].number_of_processing_attempts == 2, name


async def _both_report(client: httpx.AsyncClient) -> bool:
    text = (await client.get("/metrics")).text
    return 'worker="0"' in text and 'worker="1"' in text


async def _ingested(client: httpx.AsyncClient, deliveries: int) -> bool:
    return sum((await ingested_by_worker(client)).values()) == deliveries


def _all_counted(engine: sa.Engine, names: list[str], attempts: int) -> bool:
    rows = stored_rows(engine)
    return all(
        name in rows and rows[name].number_of_processing_attempts == attempts for name in names
    )


def _confirmation(unique_message_id: str) -> dict[str, str | None]:
    """A retry confirmation (ServiceControl.Retry.Successful) of one failed message."""
    return {
        "ServiceControl.Retry.Successful": "2026-01-01 00:00:10:000000 Z",
        "ServiceControl.Retry.UniqueMessageId": unique_message_id,
        "NServiceBus.MessageId": str(uuid.uuid4()),
        "NServiceBus.ControlMessage": "True",
    }


# -- SIGTERM drains --------------------------------------------------------------------


def test_sigterm_lets_the_workers_commit_and_acknowledge_the_batches_they_hold(
    on_transport: Settings, engine: sa.Engine, tmp_path: Path
) -> None:
    """Two workers hold deliveries, in batches whose writes wait (``writes_held``), when
    ``controlroom serve`` gets SIGTERM; each worker says what batches it holds (or that it
    holds none: its deliveries, not in a batch yet, go back), and only then may the writes
    go on. Afterwards exactly what the batches held is stored, nothing is held
    unacknowledged, and the rest is in the queue, once, none of it stored."""
    workers, batch_size, concurrent = 2, 10, 2
    settings = on_transport.model_copy(
        update={
            "ingestion": IngestionSettings(
                workers=workers, batch_size=batch_size, concurrent_batches=concurrent
            )
        }
    )
    prefetch = settings.ingestion.effective_prefetch
    names = [f"drain-{n}" for n in range(200)]
    env = {
        **os.environ,
        "CONTROLROOM_DATA_DIR": str(settings.data_dir),
        "CONTROLROOM_DATABASE_URL": settings.effective_database_url,
        "CONTROLROOM_ERROR_QUEUE": settings.error_queue,
        "CONTROLROOM_TELEMETRY_QUEUE": settings.telemetry_queue,
        "CONTROLROOM_INGESTION__WORKERS": str(workers),
        "CONTROLROOM_INGESTION__BATCH_SIZE": str(batch_size),
        "CONTROLROOM_INGESTION__CONCURRENT_BATCHES": str(concurrent),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("CONTROLROOM_BROKER_URL", None)
    if settings.broker_url:
        env["CONTROLROOM_BROKER_URL"] = settings.broker_url
    log = tmp_path / "serve.log"
    in_hand = re.compile(
        rf"the intake of '{re.escape(settings.error_queue)}' ends: "
        r"(?:finishing (\d+) batch(?:es)? in hand \((\d+) messages\)|no batch in hand)"
    )
    telemetry_ends = re.compile(rf"the intake of '{re.escape(settings.telemetry_queue)}' ends: ")
    with log.open("wb") as output:
        process = subprocess.Popen(
            [str(CONTROLROOM_EXE), "serve", "--port", "0"],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its group: nothing outlives a failed test
        )
    held: list[tuple[int, int]] = []
    try:

        async def drain() -> None:
            async with asyncio.timeout(TIMEOUT):
                await until(lambda: asyncio.sleep(0, _worker_count(process.pid) == workers))
                with writes_held(settings.effective_database_url):
                    await publish(settings, [(failed_headers(n), b"{}") for n in names])
                    # Each worker holds at most a prefetch and a message (RabbitMQ's
                    # per-consumer prefetch rises once): so each holds batches.
                    taken = len(names) - workers * prefetch
                    await until(lambda: _ready_at_most(settings, taken))
                    process.send_signal(signal.SIGTERM)
                    # Each worker has answered the stop: it says what it holds, or that it
                    # held no batch yet (its deliveries were still on the way). Its telemetry
                    # intake has stopped taking packets too, while the error queue's batches
                    # still wait: the intakes stop together, not one after the other.
                    await until(lambda: asyncio.sleep(0, _answered(log, in_hand, held, workers)))
                    await until(lambda: asyncio.sleep(0, _said(log, telemetry_ends) >= workers))

        asyncio.run(drain())
        assert process.wait(timeout=TIMEOUT) == 0, log.read_text(errors="replace")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    stored = set(stored_rows(engine))
    ready, unsettled = queue_counts(settings)
    queued = asyncio.run(take_queued_message_ids(settings))
    assert len(held) == workers, held  # each worker answered once
    assert any(batches for batches, _ in held), held  # a worker held batches when told to stop
    assert len(stored) == sum(messages for _, messages in held)  # what was held, no more
    assert unsettled == 0
    assert ready == len(queued) == len(set(queued))  # each once
    assert not stored & set(queued)  # nothing written is still queued
    assert stored | set(queued) == set(names)  # nothing lost


def _answered(
    log: Path, pattern: re.Pattern[str], into: list[tuple[int, int]], workers: int
) -> bool:
    """Whether each of the ``workers`` said ``pattern``: the batches and messages it holds
    (into ``into``), or that it holds no batch ((0, 0): its deliveries were not in a batch
    yet, and go back). Said before the worker's other parts end: those may wait on the
    writes the test holds."""
    into[:] = [
        (int(b or 0), int(m or 0)) for b, m in pattern.findall(log.read_text(errors="replace"))
    ]
    return len(into) >= workers


def _waiting_writes(engine: sa.Engine) -> bool:
    """Whether a PostgreSQL backend waits for a lock on ``failed_messages``."""
    with engine.connect() as conn:
        return bool(
            conn.exec_driver_sql(
                "SELECT count(*) FROM pg_locks WHERE NOT granted"
                " AND relation = 'failed_messages'::regclass"
            ).scalar_one()
        )


def _said(log: Path, pattern: re.Pattern[str]) -> int:
    """How many lines of ``log`` match ``pattern``."""
    return len(pattern.findall(log.read_text(errors="replace")))


def _workers_of(pid: int) -> set[int]:
    """The worker processes (multiprocessing's spawn) of process ``pid``."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.add(int(child))
    return found


def _worker_count(pid: int) -> int:
    return len(_workers_of(pid))


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def _ready_at_most(settings: Settings, limit: int) -> bool:
    return await ready_in_queue(settings) <= limit


@contextlib.contextmanager
def serving_on_postgresql(
    postgresql_url: str, tmp_path: Path, **ingestion: str
) -> Iterator[tuple[Settings, subprocess.Popen[bytes], Path]]:
    """``controlroom serve`` on PostgreSQL and an embedded queue of its own, with the
    ``CONTROLROOM_INGESTION__*`` settings ``ingestion`` (names in upper case) and batches
    of 10, logging into the path yielded; killed with its process group on leaving."""
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=postgresql_url,
        error_queue=f"error-{uuid.uuid4().hex[:8]}",
    )
    env = {
        **os.environ,
        "CONTROLROOM_DATA_DIR": str(settings.data_dir),
        "CONTROLROOM_DATABASE_URL": settings.effective_database_url,
        "CONTROLROOM_ERROR_QUEUE": settings.error_queue,
        "CONTROLROOM_INGESTION__BATCH_SIZE": "10",
        **{f"CONTROLROOM_INGESTION__{name}": value for name, value in ingestion.items()},
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("CONTROLROOM_BROKER_URL", None)
    log = tmp_path / "serve.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [str(CONTROLROOM_EXE), "serve", "--port", "0"],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its group: nothing outlives a failed test
        )
    try:
        yield settings, process, log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_worker_killed_at_the_stop_gives_its_embedded_queue_messages_back_at_once(
    postgresql_url: str, tmp_path: Path
) -> None:
    """A worker that has not ended ``workers.STOP_MARGIN_SECONDS`` past the grace is
    killed by serve; what it held in the embedded queue goes back to the queue then, as
    for a worker that died while serve ran, not when the claims' lease runs out minutes
    later. The worker holds a batch whose write waits on a PostgreSQL table lock, and is
    stopped (SIGSTOP) before serve's stop: the grace's end cancels such a write
    (``db.engine.RunningStatements``), so only a worker that cannot run at all outlasts
    the margin."""
    names = [f"killed-{n}" for n in range(40)]
    killed = re.compile(
        r"intake worker 0 did not stop; killing it: the deliveries it holds go back to the "
        r"queue, to be delivered again"
    )

    async def stop(process: subprocess.Popen[bytes], log: Path) -> None:
        (worker,) = _workers_of(process.pid)
        os.kill(worker, signal.SIGSTOP)
        process.send_signal(signal.SIGTERM)
        await until(lambda: asyncio.sleep(0, _said(log, killed) == 1))

    settings, _, text, engine = _stopped_while_a_write_waits(
        postgresql_url, tmp_path, names, stop
    )
    assert re.search(r"gave back \d+ messages intake worker 0 held", text), text
    _each_stored_or_back_in_the_queue(settings, engine, names)


def test_a_worker_whose_write_waits_on_a_lock_ends_at_the_grace_not_the_kill(
    postgresql_url: str, tmp_path: Path
) -> None:
    """Breaker's pass (session 32): with a table locked, a stop took the grace and the
    margin (62 s) and the worker was killed, without a word of why. The grace's end now
    cancels the write the worker's batch waits on: serve ends while the lock is still
    held, the worker unkilled, the batch back in the queue, and the log says so."""
    names = [f"locked-{n}" for n in range(40)]
    cancelled = re.compile(
        r"the stop's grace is over: sent a cancel to the \d+ statements? of the intake"
    )

    async def stop(process: subprocess.Popen[bytes], _log: Path) -> None:
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, TIMEOUT)  # the lock still held

    settings, process, text, engine = _stopped_while_a_write_waits(
        postgresql_url, tmp_path, names, stop
    )
    assert process.returncode == 0, text
    assert cancelled.search(text), text
    assert "did not stop" not in text, text
    _each_stored_or_back_in_the_queue(settings, engine, names)


def _stopped_while_a_write_waits(
    postgresql_url: str,
    tmp_path: Path,
    names: list[str],
    stop: Callable[[subprocess.Popen[bytes], Path], Awaitable[None]],
) -> tuple[Settings, subprocess.Popen[bytes], str, sa.Engine]:
    """Serve with one worker and a grace of 0.5 s; ``stop`` it (given serve and its log)
    while a batch's write of ``names`` waits on a table lock; then wait for serve to end.
    Returns the settings, serve, its log and an engine on the store."""
    engine = create_store_engine(postgresql_url)
    with serving_on_postgresql(postgresql_url, tmp_path, WORKERS="1", STOP_GRACE_SECONDS="0.5") as (
        settings,
        process,
        log,
    ):

        async def stop_while_held() -> None:
            async with (
                asyncio.timeout(TIMEOUT + 60),
                _a_write_waiting_on_a_lock(settings, process, engine, names),
            ):
                await stop(process, log)
            await asyncio.to_thread(process.wait, TIMEOUT)

        asyncio.run(stop_while_held())
    return settings, process, log.read_text(errors="replace"), engine


@contextlib.asynccontextmanager
async def _a_write_waiting_on_a_lock(
    settings: Settings, process: subprocess.Popen[bytes], engine: sa.Engine, names: list[str]
) -> AsyncIterator[None]:
    """Once serve's worker runs, hold the store's writes and publish ``names``; enter once
    a batch's write waits on the lock (the worker holds it), which is held until the block
    ends."""
    await until(lambda: asyncio.sleep(0, _worker_count(process.pid) == 1))
    with writes_held(settings.effective_database_url):
        await publish(settings, [(failed_headers(n), b"{}") for n in names])
        await until(lambda: asyncio.to_thread(_waiting_writes, engine))
        yield


def _each_stored_or_back_in_the_queue(
    settings: Settings, engine: sa.Engine, names: list[str]
) -> None:
    """Every one of ``names`` stored or ready in the queue, nothing left leased; disposes
    of ``engine``."""
    ready, unsettled = queue_counts(settings)
    assert unsettled == 0
    try:
        assert ready + len(stored_rows(engine)) == len(names)
    finally:
        engine.dispose()


@contextlib.asynccontextmanager
async def _interrupted_twice_while_a_write_waits(
    settings: Settings, process: subprocess.Popen[bytes], log: Path, engine: sa.Engine
) -> AsyncIterator[None]:
    """Publish while the store's writes are held, SIGINT serve once a write waits, again
    once the stop has begun, and wait for serve to end; the lock is held until the block
    ends."""
    stopping = re.compile(r"finishing \d+ batch")
    with writes_held(settings.effective_database_url):
        names = [f"held-{n}" for n in range(10)]
        await publish(settings, [(failed_headers(n), b"{}") for n in names])
        await until(lambda: asyncio.to_thread(_waiting_writes, engine))
        process.send_signal(signal.SIGINT)
        await until(lambda: asyncio.sleep(0, _said(log, stopping) == 1))
        process.send_signal(signal.SIGINT)
        await asyncio.to_thread(process.wait, TIMEOUT)
        yield


def test_a_second_ctrl_c_ends_serve_at_once_while_a_write_waits(
    postgresql_url: str, tmp_path: Path
) -> None:
    """docs/decisions.md "A stop finishes the batches in hand": a second SIGINT, as a
    second SIGTERM, ends serve at once, even while the stop waits on a write (breaker pass:
    with ``workers = 0`` a second Ctrl+C waited for the write's lock). The lock is held
    until serve has ended: without the change it never ends."""
    engine = create_store_engine(postgresql_url)
    with serving_on_postgresql(postgresql_url, tmp_path, WORKERS="0") as (settings, process, log):

        async def interrupt_twice() -> None:
            async with asyncio.timeout(TIMEOUT + 60):
                await until(lambda: asyncio.sleep(0, "Controlroom is serving" in log.read_text()))
                async with _interrupted_twice_while_a_write_waits(settings, process, log, engine):
                    pass

        try:
            asyncio.run(interrupt_twice())
        finally:
            engine.dispose()

    text = log.read_text(errors="replace")
    assert process.returncode == -signal.SIGINT, text
    # Said at the first signal: what the stop does, and that a second one ends it, and
    # what then becomes of the batches in hand (fresh user's pass, session 31: nothing
    # said so when the second one came, as the process ended on the spot).
    said = " ".join(text.split())
    assert "Stopping: the intakes finish the batches in hand" in said, text
    assert (
        "a second Ctrl+C or SIGTERM ends serve at once, leaving what the intakes hold to "
        "their queues, to be delivered again"
    ) in said, text
    # And when the second comes (fresh user, session 32: serve ended without a word).
    assert re.search(
        r"WARNING controlroom\.cli: SIGINT again: serve ends now; what the intakes hold goes "
        r"back to their queues \(the embedded queue's when a process next opens it\), and "
        r"intake's cgroup, if any, to the next serve of this data directory",
        said,
    ), text


def test_a_second_ctrl_c_ends_the_workers_with_serve(postgresql_url: str, tmp_path: Path) -> None:
    """The second signal ends serve at once, and its workers with it (fresh-user pass: the
    worker, its write waiting on a lock, went on alone beside a new serve on the same
    data directory until its own grace ran out, or for as long as the lock was held).
    The worker's write waits on the lock until the worker has ended: without the change
    it never does."""
    engine = create_store_engine(postgresql_url)
    with serving_on_postgresql(postgresql_url, tmp_path, WORKERS="1") as (settings, process, log):

        async def interrupt_twice() -> None:
            async with asyncio.timeout(TIMEOUT + 60):
                await until(lambda: asyncio.sleep(0, _worker_count(process.pid) == 1))
                (worker,) = _workers_of(process.pid)
                async with _interrupted_twice_while_a_write_waits(settings, process, log, engine):
                    await until(lambda: asyncio.sleep(0, not _running(worker)))

        try:
            asyncio.run(interrupt_twice())
        finally:
            engine.dispose()

    assert process.returncode == -signal.SIGINT, log.read_text(errors="replace")
