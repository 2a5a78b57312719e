"""Embedded-queue-only behaviour: several processes on one file, leases, queue names as
data. Processes are real subprocesses; concurrent consumers start on a barrier and the
assertions run after they are all done."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlroom.transport import Delivery, EmbeddedQueue, embedded
from controlroom.transport.embedded import SCHEMA_VERSION
from tests.transport.helpers import Collector

pytestmark = pytest.mark.anyio

TIMEOUT = 60  # seconds, per test

PUBLISHER = """
import asyncio, sys
from pathlib import Path
from controlroom.transport import EmbeddedQueue

async def main(path, queue, count):
    async with EmbeddedQueue(Path(path)) as transport:
        for n in range(count):
            await transport.publish(queue, {"seq": str(n)}, f"message {n}".encode())
            if n % 10 == 0:
                await asyncio.sleep(0.01)  # interleave with the consumer

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""

ENDING_CONSUMER = """
import asyncio, os, signal, sys
from pathlib import Path
from controlroom.transport import EmbeddedQueue

async def main(path, queue, lease, how):
    transport = EmbeddedQueue(Path(path), lease_seconds=lease)
    await transport.start()
    async for delivery in transport.consume(queue, 10):
        print(delivery.headers["seq"], flush=True)
        if how == "crash":
            os._exit(3)  # no ack, no close, no lease release
        os.kill(os.getpid(), signal.SIGSTOP)  # stuck: alive, but renews nothing any more

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]))
"""

CONSUMER = """
import asyncio, contextlib, json, sys
from pathlib import Path
from controlroom.transport import EmbeddedQueue

async def main(path, queue, go_file):
    while not Path(go_file).exists():  # the cross-process barrier
        await asyncio.sleep(0.005)
    seen = []
    async with EmbeddedQueue(Path(path), poll_interval_seconds=0.01) as transport:
        consumer = transport.consume(queue, 4)
        async with contextlib.aclosing(consumer):
            while True:
                try:
                    delivery = await asyncio.wait_for(anext(consumer), 1.5)
                except TimeoutError:
                    break  # idle: the queue is drained
                seen.append(int(delivery.headers["seq"]))
                await delivery.ack()
    print(json.dumps(seen))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""


@contextlib.asynccontextmanager
async def run_python(code: str, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run ``code`` in a fresh interpreter; killed on the way out if still running."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.communicate()


async def publish_sequence(queue_path: Path, queue: str, count: int) -> None:
    async with EmbeddedQueue(queue_path) as transport:
        for n in range(count):
            await transport.publish(queue, {"seq": str(n)}, f"message {n}".encode())


def seq(delivery: Delivery) -> int:
    return int(delivery.headers["seq"] or -1)


async def test_a_message_published_by_another_process_arrives_exactly_once(
    queue_path: Path, queue_name: str
) -> None:
    count = 100
    async with asyncio.timeout(TIMEOUT), EmbeddedQueue(queue_path) as transport:
        async with Collector(transport, queue_name, prefetch=10) as consumer:
            received = []
            async with run_python(PUBLISHER, str(queue_path), queue_name, str(count)) as publisher:
                for _ in range(count):
                    delivery = await consumer.get(timeout=30)
                    received.append(seq(delivery))
                    await delivery.ack()
                _, stderr = await publisher.communicate()
                assert publisher.returncode == 0, stderr.decode()
            await consumer.assert_idle(1.0)
        assert received == list(range(count))  # exactly once, and in FIFO order
        assert await transport.purge(queue_name) == 0


async def test_messages_survive_a_restart(queue_path: Path, queue_name: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        await publish_sequence(queue_path, queue_name, 3)
        async with (
            EmbeddedQueue(queue_path) as transport,
            Collector(transport, queue_name, prefetch=3) as consumer,
        ):
            deliveries = await consumer.get_many(3)
            assert [seq(d) for d in deliveries] == [0, 1, 2]
            for delivery in deliveries:
                await delivery.ack()


async def test_a_crashed_consumers_messages_come_back_when_the_queue_is_next_opened(
    queue_path: Path, queue_name: str
) -> None:
    """A consumer that ended without closing (``kill -9``, a crash) holds no lock on its
    record any more: the next transport to open the file gives its claims back at once,
    not at the lease's expiry (breaker's pass, session 32: a killed serve's 400 messages
    waited 5 minutes, shown nowhere)."""
    lease = 600.0  # far past the test's timeout: only the release brings it back
    async with asyncio.timeout(TIMEOUT):
        await publish_sequence(queue_path, queue_name, 1)
        args = (str(queue_path), queue_name, str(lease), "crash")
        async with run_python(ENDING_CONSUMER, *args) as crashing:
            stdout, stderr = await crashing.communicate()
            assert (crashing.returncode, stdout.strip()) == (3, b"0"), stderr.decode()

        async with (
            EmbeddedQueue(queue_path, poll_interval_seconds=0.05) as transport,
            Collector(transport, queue_name, prefetch=1) as consumer,
        ):
            delivery = await consumer.get(timeout=30)
            assert seq(delivery) == 0
            await delivery.ack()


async def test_a_stuck_consumers_messages_come_back_when_the_lease_expires(
    queue_path: Path, queue_name: str
) -> None:
    """A consumer alive but stuck (its process stopped) keeps its record's lock, so its
    claims are not given back at open; they come back when the lease runs out."""
    lease = 3.0
    async with asyncio.timeout(TIMEOUT):
        await publish_sequence(queue_path, queue_name, 1)
        args = (str(queue_path), queue_name, str(lease), "stick")
        async with run_python(ENDING_CONSUMER, *args) as stuck:
            assert stuck.stdout is not None
            assert (await stuck.stdout.readline()).strip() == b"0"
            async with (
                EmbeddedQueue(queue_path, poll_interval_seconds=0.05) as transport,
                Collector(transport, queue_name, prefetch=1) as consumer,
            ):
                await consumer.assert_idle(0.5)  # still leased to the stuck process
                delivery = await consumer.get(timeout=lease + 10)
                assert seq(delivery) == 0
                await delivery.ack()
            stuck.kill()


async def test_a_live_consumer_keeps_its_lease_past_the_lease_period(
    queue_path: Path, queue_name: str
) -> None:
    # Long enough that a renewal (every third of it) is not missed on a loaded machine:
    # 0.6 s once let the lease lapse under a full test run beside a benchmark.
    lease = 1.5
    async with asyncio.timeout(TIMEOUT):
        await publish_sequence(queue_path, queue_name, 1)
        async with (
            EmbeddedQueue(queue_path, lease_seconds=lease) as holder,
            EmbeddedQueue(queue_path, poll_interval_seconds=0.02) as other,
            Collector(holder, queue_name, prefetch=1) as consumer,
        ):
            delivery = await consumer.get()
            async with Collector(other, queue_name, prefetch=1) as rival:
                await rival.assert_idle(lease * 4)  # renewed, never expired
            await delivery.ack()  # still ours: no DeliveryLostError


@pytest.mark.parametrize("shared", [False, True], ids=["two-transports", "one-transport"])
async def test_concurrent_consumers_never_receive_the_same_message(
    queue_path: Path, queue_name: str, shared: bool
) -> None:
    count = 300
    await publish_sequence(queue_path, queue_name, count)
    transports = [EmbeddedQueue(queue_path, poll_interval_seconds=0.005) for _ in range(2)]
    if shared:
        transports[1] = transports[0]
    barrier = asyncio.Barrier(2)
    received: list[list[int]] = [[], []]
    all_in = asyncio.Event()

    async def consume(index: int, transport: EmbeddedQueue) -> None:
        await barrier.wait()
        consumer = transport.consume(queue_name, 3)
        async with contextlib.aclosing(consumer):
            async for delivery in consumer:
                received[index].append(seq(delivery))
                await asyncio.sleep(0)  # let the other consumer claim meanwhile
                await delivery.ack()
                if sum(map(len, received)) >= count:
                    all_in.set()

    async with asyncio.timeout(TIMEOUT):
        for transport in set(transports):
            await transport.start()
        tasks = [asyncio.create_task(consume(i, t)) for i, t in enumerate(transports)]
        await all_in.wait()
        await asyncio.sleep(0.3)  # time for a duplicate to show up, if there were one
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for transport in set(transports):
            await transport.close()

    errors = [r for r in results if not isinstance(r, asyncio.CancelledError | None)]
    assert errors == []
    assert not set(received[0]) & set(received[1])
    assert sorted(received[0] + received[1]) == list(range(count))
    assert received[0] and received[1], "both consumers should have taken part"


async def test_consumer_processes_share_a_queue_without_duplicates(
    queue_path: Path, queue_name: str, tmp_path: Path
) -> None:
    count, processes = 300, 3
    go_file = tmp_path / "go"
    async with asyncio.timeout(TIMEOUT), contextlib.AsyncExitStack() as stack:
        await publish_sequence(queue_path, queue_name, count)
        args = (str(queue_path), queue_name, str(go_file))
        consumers = [
            await stack.enter_async_context(run_python(CONSUMER, *args)) for _ in range(processes)
        ]
        await asyncio.sleep(0.5)  # let them import and reach the barrier
        go_file.touch()
        outputs = [await c.communicate() for c in consumers]

    seen: list[list[int]] = []
    for consumer, (stdout, stderr) in zip(consumers, outputs, strict=True):
        assert consumer.returncode == 0, stderr.decode()
        seen.append(json.loads(stdout))
    everything = [n for part in seen for n in part]
    assert sorted(everything) == list(range(count))  # each exactly once


async def test_queue_names_are_data_not_sql_or_paths(queue_path: Path) -> None:
    names = ["x'; DROP TABLE queue_messages; --", "../../escape", 'a"b', "日本", "error"]
    async with asyncio.timeout(TIMEOUT), EmbeddedQueue(queue_path) as transport:
        for name in names:
            await transport.publish(name, {"name": name}, name.encode())
        for name in names:
            async with Collector(transport, name, prefetch=5) as consumer:
                delivery = await consumer.get()
                assert (delivery.queue, delivery.headers["name"]) == (name, name)
                await delivery.ack()
                await consumer.assert_idle(0.2)
    # No file named after a queue; the owners' records, none left once closed.
    assert sorted(p.name for p in queue_path.parent.iterdir()) == ["queue.db", "queue.db.consumers"]
    assert not list((queue_path.parent / "queue.db.consumers").iterdir())


def wal_bytes(queue_path: Path) -> int:
    wal = queue_path.with_name(queue_path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


async def test_claiming_and_renewing_a_message_never_rewrites_its_body(
    queue_path: Path, queue_name: str
) -> None:
    # SQLite rewrites a row whole: a body kept in the row that a claim, a renewal or a
    # release updates was read into memory and written to the WAL again each time.
    body = os.urandom(8 * 1024 * 1024)
    async with EmbeddedQueue(queue_path) as transport:
        await transport.publish(queue_name, {"seq": "0"}, body)
    with contextlib.closing(sqlite3.connect(queue_path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    assert wal_bytes(queue_path) == 0
    async with asyncio.timeout(TIMEOUT), EmbeddedQueue(queue_path) as transport:
        consumer = transport.consume(queue_name, 10, max_bytes=64 * 1024 * 1024)
        async with contextlib.aclosing(consumer):
            delivery = await anext(consumer)
            await transport._run(lambda _conn: transport._renew_sync([1]))
            grown = wal_bytes(queue_path)
            await delivery.reject(requeue=True)
            redelivered = await anext(consumer)
            assert redelivered.body == body
            await redelivered.ack()
    assert delivery.body == body
    assert grown < len(body) // 8


async def test_a_queue_file_of_version_1_is_moved_to_the_current_version(
    queue_path: Path,
) -> None:
    queue_path.parent.mkdir(parents=True)
    with contextlib.closing(sqlite3.connect(queue_path)) as conn:
        conn.execute(
            """CREATE TABLE queue_messages (
                id INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL,
                headers_json TEXT NOT NULL, body BLOB NOT NULL, message_id TEXT,
                content_type TEXT, enqueued_at REAL NOT NULL,
                delivery_count INTEGER NOT NULL DEFAULT 0, lease_owner TEXT,
                lease_expires_at REAL NOT NULL DEFAULT 0)"""
        )
        conn.execute(
            "INSERT INTO queue_messages (queue, headers_json, body, enqueued_at) "
            "VALUES ('error', '{\"seq\":\"7\"}', x'00ff', 0)"
        )
        conn.execute("PRAGMA user_version=1")
        conn.commit()
    async with asyncio.timeout(TIMEOUT), EmbeddedQueue(queue_path) as transport:
        consumer = transport.consume("error", 10, max_bytes=1024)
        async with contextlib.aclosing(consumer):
            delivery = await anext(consumer)
            await delivery.ack()
    assert (delivery.headers["seq"], delivery.body) == ("7", b"\x00\xff")
    with contextlib.closing(sqlite3.connect(queue_path)) as conn:
        assert conn.execute("SELECT count(*) FROM queue_bodies").fetchone() == (0,)
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)


async def test_a_record_that_goes_while_the_queue_opens_is_passed_over(
    queue_path: Path, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breaker's pass (session 32): a transport closing removes its record a moment before
    its lock goes; one opening then found it neither held nor there, and failed to start
    (4 of 200 opens of 8 processes). The race, step by step: the record goes between the
    listing and the look at its lock."""
    async with EmbeddedQueue(queue_path):
        pass
    records = queue_path.with_name(f"{queue_path.name}.consumers")
    (records / ("0" * 32)).write_text("an owner closing now")

    def gone_meanwhile(record: Path) -> bool:
        record.unlink(missing_ok=True)  # its owner closed between the listing and now
        return False

    monkeypatch.setattr(embedded.file_locks, "held_elsewhere", gone_meanwhile)
    async with asyncio.timeout(TIMEOUT), EmbeddedQueue(queue_path) as transport:
        await transport.publish(queue_name, {"seq": "0"}, b"opened")


async def test_where_files_cannot_be_locked_no_owners_claims_are_given_back(
    queue_path: Path, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No platform lock, no record held: a live consumer's claims would look like an
    ended one's, so the open gives none back (their lease does)."""
    lease = 600.0
    async with asyncio.timeout(TIMEOUT):
        await publish_sequence(queue_path, queue_name, 1)
        args = (str(queue_path), queue_name, str(lease), "crash")
        async with run_python(ENDING_CONSUMER, *args) as crashing:
            await crashing.communicate()
        monkeypatch.setattr(embedded.file_locks, "LOCKS", False)
        async with (
            EmbeddedQueue(queue_path, poll_interval_seconds=0.05) as transport,
            Collector(transport, queue_name, prefetch=1) as consumer,
        ):
            await consumer.assert_idle(0.5)  # still leased
