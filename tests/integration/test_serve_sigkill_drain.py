"""docs/decisions.md "Killing a serve process loses nothing": two ``controlroom serve`` processes
drain pre-queued failed messages from RabbitMQ into PostgreSQL while one of them is killed with
SIGKILL every few seconds and restarted. Every message is stored, nothing is left unacknowledged
(the queue ends empty with no unacknowledged message), and every attempt count equals the number of
distinct times of failure published for that message.

What is killed (``KILLS``): ``serve`` alone (its intake worker, whose pipe closes, then stops as
on SIGTERM: docs/design.md "Process shape"); the intake workers themselves, the processes that
write between a commit and its acknowledgement, with ``ingestion.workers`` 1 and 2 (some or all
of one ``serve``'s at a time; ``serve`` starts them again); or ``serve`` and its workers together
(its process group), then a fresh ``serve`` drains the rest.

The messages repeat ids (several attempts of one message) and repeat attempts (the same
attempt published twice, as at-least-once redelivery does); a kill between a commit and
its acknowledgement replays a batch, which must count nothing twice. They reach the queue
in ``PARTS`` parts, the next one after each kill, so that however fast the machine drains,
the drain spans at least ``PARTS - 1`` kills (all at once, a quiet machine's four workers
drained the queue before a second kill).

Size: 4,000 messages by default, not 20,000, to keep ``make test`` within its
budget: each restart of ``serve`` costs seconds of start-up before it ingests again, so
the drain under kills runs far below the service's rate; the variants added for the workers
drain half as many (at 4,000 each ran about 30 s alone, up to 80 s beside another test;
at half, each still lost messages when acknowledgements went before commits).
``SIGKILL_DRAIN_MESSAGES=20000`` (with ``SIGKILL_DRAIN_DEADLINE`` in seconds) runs the full
size."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import aio_pika
import pytest
import sqlalchemy as sa

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import failed_messages
from tests.factories import at
from tests.nsb import failed_headers
from tests.servers import rabbitmq_queue_counts

pytestmark = [pytest.mark.postgresql, pytest.mark.rabbitmq]

MESSAGES = int(os.environ.get("SIGKILL_DRAIN_MESSAGES", "4000"))
KILLS = [  # (what is killed, ingestion.workers, messages)
    pytest.param("serve", 1, MESSAGES, id="serve"),
    pytest.param("workers", 1, MESSAGES // 2, id="workers-1"),
    pytest.param("workers", 2, MESSAGES // 2, id="workers-2"),
    pytest.param("group", 2, MESSAGES // 2, id="group-2"),
]
KILL_AFTER_SECONDS = (2.0, 5.0)  # how long a victim ingests before its SIGKILL
KILLS_PER_DRAIN = 10  # ... or a tenth of the attempts, whichever comes first
PARTS = 4  # the messages are published in parts, the next one after each kill
INGESTING = b"Ingesting queues"
QUEUE_CHECK_SECONDS = 5.0
DRAIN_DEADLINE_SECONDS = float(os.environ.get("SIGKILL_DRAIN_DEADLINE", "240"))
CONTROLROOM_EXE = Path(sys.executable).with_name("controlroom")


def plan_messages(total: int, seed: int) -> tuple[list[tuple[dict, bytes]], dict[str, int]]:
    """``total`` messages in a shuffled order: each message id fails 1 to 4 distinct
    times, and about a third of the attempts are published twice. Returns the messages
    and, per message id, the number of distinct times of failure."""
    rng = random.Random(seed)
    messages: list[tuple[dict, bytes]] = []
    distinct: dict[str, int] = {}
    n = 0
    while len(messages) < total:
        message_id = f"order-{n}"
        n += 1
        times = rng.sample(range(1, 10_000), rng.randint(1, 4))
        distinct[message_id] = 0
        for seconds in times:
            if len(messages) >= total:
                break
            distinct[message_id] += 1
            headers = failed_headers(message_id, failed_at=at(0) + timedelta(seconds=seconds))
            body = f'{{"order": {n}, "attempt": {seconds}}}'.encode()
            copies = 2 if rng.random() < 0.33 and len(messages) + 1 < total else 1
            messages += [(headers, body)] * copies
    rng.shuffle(messages)
    return messages, {k: v for k, v in distinct.items() if v}


async def publish_fast(url: str, queue: str, messages: list[tuple[dict, bytes]]) -> None:
    """Publish persistently with publisher confirms, many in flight at once."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue, durable=True)
        for start in range(0, len(messages), 1000):
            await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        aio_pika.Message(
                            body,
                            headers=headers,
                            message_id=headers["NServiceBus.MessageId"],
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        ),
                        routing_key=queue,
                    )
                    for headers, body in messages[start : start + 1000]
                )
            )


def stored(engine: sa.Engine) -> tuple[int, int]:
    """(rows, sum of attempt counts) of ``failed_messages``."""
    with engine.connect() as conn:
        rows, attempts = conn.execute(
            sa.select(
                sa.func.count(),
                sa.func.coalesce(sa.func.sum(failed_messages.c.number_of_processing_attempts), 0),
            )
        ).one()
    return int(rows), int(attempts)


def worker_pids(pid: int) -> set[int]:
    """The live intake workers (multiprocessing's spawn) of process ``pid`` (Linux /proc:
    a killed one not reaped yet has no command line)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):  # pid itself ended
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                for child in (task / "children").read_text().split():
                    if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                        found.add(int(child))
    return found


class Servers:
    """Two ``controlroom serve`` processes over one database and one queue; one at a time
    (alternately) is killed a few seconds after it started ingesting, and restarted. With
    ``kill`` "workers" the victim's intake workers are killed instead (some or all, once it
    runs all ``workers``; serve starts them again); with "group" serve and its workers
    together."""

    def __init__(
        self,
        env: dict[str, str],
        logs: Path,
        rng: random.Random,
        kill_every: int,
        *,
        kill: str = "serve",
        workers: int = 1,
    ) -> None:
        self._env = env
        self._kill_every = kill_every
        self._kill = kill
        self._workers = workers
        self._progress_at: int | None = None
        self._logs = logs
        self._rng = rng
        self._starts = 0
        self.kills = 0
        self.processes: list[tuple[subprocess.Popen[bytes], Path]] = [self._start(), self._start()]
        self._victim = 0
        self._kill_at: float | None = None

    def _start(self) -> tuple[subprocess.Popen[bytes], Path]:
        self._starts += 1
        log = self._logs / f"serve-{self._starts}.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                [str(CONTROLROOM_EXE), "serve", "--port", "0"],
                stdout=output,
                stderr=subprocess.STDOUT,
                env=self._env,
                start_new_session=True,  # a group of its own: serve and its workers
            )
        return process, log

    def step(self, progress: int) -> None:
        """Kill the victim once it has ingested for a few seconds (measured from its
        startup line, so a slow start on a loaded machine is not what gets killed) or once
        ``progress`` (attempts stored) grew by ``kill_every`` since then, so that a fast
        drain on an idle machine is killed as often as a slow one."""
        process, log = self.processes[self._victim]
        for other, _ in self.processes:
            assert other.poll() is None, f"serve exited on its own: {other.returncode}"
        if self._kill_at is None:
            if INGESTING not in log.read_bytes():
                return
            if self._kill == "workers" and len(worker_pids(process.pid)) < self._workers:
                return  # the workers killed last time are not all started again yet
            self._kill_at = time.monotonic() + self._rng.uniform(*KILL_AFTER_SECONDS)
            self._progress_at = progress
        assert self._progress_at is not None
        if time.monotonic() < self._kill_at and progress - self._progress_at < self._kill_every:
            return
        if self._kill == "workers":
            workers = sorted(worker_pids(process.pid))
            if not workers:
                return  # one ended on its own: serve logs it and starts it again
            for pid in self._rng.sample(workers, self._rng.randint(1, len(workers))):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        else:
            if self._kill == "group":
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
            self.processes[self._victim] = self._start()
        self.kills += 1
        self._victim = 1 - self._victim
        self._kill_at = None

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of every process's log (for a failure's message)."""
        tails = []
        for log in sorted(self._logs.glob("serve-*.log")):
            tails.append(
                f"--- {log.name}\n"
                + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
            )
        return "\n".join(tails)

    def stop(self) -> list[tuple[int | None, bool]]:
        """SIGTERM both; returns (exit code, whether it had started ingesting) of each."""
        for process, _ in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes: list[tuple[int | None, bool]] = []
        for process, log in self.processes:
            try:
                code: int | None = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                dump_stacks(process.pid, log)  # where it hangs, for the failure's message
                process.kill()
                code = None
            codes.append((code, INGESTING in log.read_bytes()))
            with contextlib.suppress(ProcessLookupError):  # a worker left by a failure
                os.killpg(process.pid, signal.SIGKILL)
        return codes


def dump_stacks(pid: int, log: Path) -> None:
    """Append the Python stacks of process ``pid`` to ``log`` (py-spy, a dev dependency;
    nothing when it is missing or not allowed to attach)."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return
    dump = subprocess.run(
        [str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
    )
    with log.open("a") as output:
        output.write(f"--- py-spy dump\n{dump.stdout}{dump.stderr}")


@pytest.fixture
def servers_env(postgresql_url: str, rabbitmq_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of both ``serve`` processes (one worker each unless a test sets
    ``CONTROLROOM_INGESTION__WORKERS``)."""
    env = dict(os.environ)
    env.update(
        CONTROLROOM_DATA_DIR=str(tmp_path / "data"),
        CONTROLROOM_DATABASE_URL=postgresql_url,
        CONTROLROOM_BROKER_URL=rabbitmq_url,
        CONTROLROOM_ERROR_QUEUE=f"error-{uuid.uuid4().hex[:8]}",
        CONTROLROOM_TELEMETRY_QUEUE=f"telemetry-{uuid.uuid4().hex[:8]}",
        CONTROLROOM_INGESTION__MAX_BACKOFF_SECONDS="1",
        # Small batches: more commits, so more kills land between a commit and its ack.
        CONTROLROOM_INGESTION__BATCH_SIZE="25",
        PYTHONUNBUFFERED="1",  # the startup line reaches the log at once
    )
    yield env


@pytest.mark.parametrize(("kill", "workers", "size"), KILLS)
def test_two_servers_drain_the_queue_exactly_while_one_is_killed_again_and_again(
    servers_env: dict[str, str], tmp_path: Path, kill: str, workers: int, size: int
) -> None:
    servers_env["CONTROLROOM_INGESTION__WORKERS"] = str(workers)
    queue = servers_env["CONTROLROOM_ERROR_QUEUE"]
    broker = servers_env["CONTROLROOM_BROKER_URL"]
    engine = create_store_engine(servers_env["CONTROLROOM_DATABASE_URL"])
    try:
        upgrade_database(engine)  # once, before two processes start
        messages, distinct = plan_messages(size, seed=15)
        part = -(-len(messages) // PARTS)
        parts = [messages[start : start + part] for start in range(0, len(messages), part)]
        asyncio.run(publish_fast(broker, queue, parts.pop(0)))
        assert rabbitmq_queue_counts(broker, queue) == (part, 0)

        logs = tmp_path / "logs"
        logs.mkdir()
        kill_every = max(1, sum(distinct.values()) // KILLS_PER_DRAIN)
        serving = Servers(
            servers_env, logs, random.Random(15), kill_every, kill=kill, workers=workers
        )
        try:
            deadline = time.monotonic() + DRAIN_DEADLINE_SECONDS
            expected = (len(distinct), sum(distinct.values()))
            # Until every row is there and counts at least every attempt (more would be a
            # miscount, reported below message by message), or, every part published, the
            # broker holds nothing more (nothing else will come; what is missing was lost).
            next_queue_check = time.monotonic() + QUEUE_CHECK_SECONDS
            while True:
                now = stored(engine)
                if not parts and now[0] >= expected[0] and now[1] >= expected[1]:
                    break
                assert time.monotonic() < deadline, (
                    f"not drained after {DRAIN_DEADLINE_SECONDS} s: {now} of "
                    f"{expected}; queue {rabbitmq_queue_counts(broker, queue)}\n"
                    f"{serving.log_tail()}"
                )
                if not parts and time.monotonic() >= next_queue_check:
                    if rabbitmq_queue_counts(broker, queue) == (0, 0) and stored(engine) == now:
                        break
                    next_queue_check = time.monotonic() + QUEUE_CHECK_SECONDS
                kills = serving.kills
                serving.step(now[1])
                if parts and serving.kills > kills:
                    asyncio.run(publish_fast(broker, queue, parts.pop(0)))
                time.sleep(0.2)
            # Everything is stored; the last acknowledgements follow their commits.
            while rabbitmq_queue_counts(broker, queue) != (0, 0):
                assert time.monotonic() < deadline, (
                    f"queue left {rabbitmq_queue_counts(broker, queue)}"
                )
                time.sleep(0.5)
        finally:
            codes = serving.stop()
        assert rabbitmq_queue_counts(broker, queue) == (
            0,
            0,
        )  # nothing came back when they stopped

        with engine.connect() as conn:
            counts = dict(
                conn.execute(
                    sa.select(
                        failed_messages.c.message_id,
                        failed_messages.c.number_of_processing_attempts,
                    )
                ).all()
            )
        missing = sorted(set(distinct) - set(counts))
        miscounted = {k: (counts[k], v) for k, v in distinct.items() if counts.get(k, v) != v}
        assert not missing, f"{len(missing)} messages lost, e.g. {missing[:5]}"
        assert not miscounted, f"{len(miscounted)} miscounted (stored, true): {miscounted}"
        assert counts.keys() == distinct.keys()
        # A process that was ingesting stops cleanly on SIGTERM (one still starting up
        # may die of it before its handlers are installed).
        assert [code for code, ready in codes if ready] == [0] * sum(r for _, r in codes), (
            f"a serve did not stop cleanly on SIGTERM (None: not within 60 s): {codes}\n"
            f"{serving.log_tail(40)}"
        )
    finally:
        engine.dispose()
