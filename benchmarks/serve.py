"""End-to-end benchmark: ``controlroom serve`` draining a pre-filled RabbitMQ error queue
into PostgreSQL, beside the write path alone and the previous schema's serve
(docs/decisions.md "Throughput is measured end to end"). Runs after ``ingest.py`` in ``make bench``.

What it does (see ``benchmarks/README.md`` for how to read the figures):

1. Generates ``--messages`` (default 100,000) failed messages with ``ingest.py``'s
   generator (about 3 KB of headers, a 1 KB JSON body, 10 % later attempts of an earlier
   message) and parses them once, for the write path alone.
2. **Write path alone**: ``FailedMessageBatchWriter.write`` over batches of the production
   size, ``concurrent_batches`` threads at once, on a scratch database migrated to head
   (``ingest.measure``: warm-up, emptied tables, client and backend CPU).
3. **End to end**: publishes the messages to queue ``error`` of a scratch RabbitMQ vhost
   (publisher confirms, pipelined), *then* starts ``controlroom serve`` as a subprocess on
   a second scratch database (migrated to head beforehand) and that vhost, and follows the
   drain until every message is acknowledged: ``controlroom_ingested_messages_total``
   from serve's ``/metrics``, serve's CPU (``/proc/<pid>/stat``) and peak RSS
   (``VmHWM``), and the CPU of the PostgreSQL processes connected to the scratch database
   (``pg_stat_activity``, then ``/proc``), every ``--poll-seconds``. Then it stops serve
   (SIGTERM), checks that the queue is empty and reads the end state.
4. **Today's serve with the previous schema and writer** (the baseline of "end to end >=
   2.5x", formerly called "previous schema's end to end"): the same on a database
   migrated to 0004, with serve started through ``previous_serve.py``: only the writer is
   swapped (``previous_write_path.py``, no migration on start); transport, batcher and
   parsing are today's. ``ingest.py``'s ``prevwriter`` run isolates the writer on today's
   schema.
5. Prints each run, its rate over the drain in tenths, and every end-to-end figure as a
   ratio beside its target; drops the databases and vhosts.

With ``--stored N`` (the issue "Cost must not grow with the table"), step 4 is replaced by
the same serve draining the same backlog into a store that already holds N failed
messages, side by side with the drain into an empty one (``--rounds``: the order
alternates, the ratio is taken within each round). The N messages are written once,
before any drain, by the write path itself (``FailedMessageBatchWriter`` over ``ingest.py``'s
generator, chunks of ``STORED_CHUNK_ROWS`` messages, each chunk 6 hours older than the
next, production's batch size and concurrency): so the group rows, known endpoints, tallies,
group counts and hours and the organically grown indexes are what production's are, by
construction (``query.py``'s loader is faster but rebuilds the indexes packed after a COPY,
and the growth measured here is index maintenance). Then a share of them is archived or
resolved (``STORED_STATUS_PERCENT``, through the triggers, as an operator would), the
counters are folded, and ``VACUUM ANALYZE`` and a ``CHECKPOINT`` leave it as autovacuum
would have. That database is the template each round's stored drain copies
(``CREATE DATABASE ... TEMPLATE``). Every drain, empty or not, starts right after a
``CHECKPOINT``, and is followed by another whose work is counted with the run's: for each
drain the report adds the whole server's CPU (background writer, checkpointer and WAL
writer included; meaningful on ``--scratch-server``, which nothing else uses), the WAL and
its full-page images, the buffers backends had to write themselves, and the index blocks
the drain read from outside shared buffers, per index. ``--wal-by-relation`` adds the
full-page images by relation and record, read from the drain's WAL (``pg_walinspect``);
``--variant NAME=VALUE`` drains both stores again in each round with one server setting
changed (by a reload, or by restarting the scratch server for one only a start applies,
such as ``huge_pages``), and prints its ratios beside the base's.

Run: ``make bench`` (after ``ingest.py``) or ``.venv/bin/python benchmarks/serve.py
[--messages N]``. Servers: ``CONTROLROOM_BENCH_POSTGRESQL_URL`` (admin URL, as
``ingest.py``) and ``CONTROLROOM_BENCH_RABBITMQ_URL`` (default
``amqp://guest:guest@127.0.0.1:5672/``; the vhosts are made with ``rabbitmqctl``), both on
this machine (CPU is read from ``/proc``). ``--profile DIR`` runs serve and its worker
processes under ``py-spy record`` (``pip install py-spy``) and prints where their CPU went;
``--busy N`` runs N busy loops beside each drain, each a session of its own, as a machine
busy with other work. ``--server-profile DIR`` samples the machine with Linux ``perf``
during each drain and, with
``--stored``, prints PostgreSQL's CPU per message by function into both stores
(``perf_profile.py``).

The empty-vs-stored comparison at the target's scale, on a scratch server with production's
settings (``pgserver.PRODUCTION_SETTINGS``) and with the defaults::

    .venv/bin/python benchmarks/serve.py --scratch-server --production-settings \
        --scratch-setting shared_buffers=9GB --stored 1000000 --messages 100000 --rounds 2
    .venv/bin/python benchmarks/serve.py --scratch-server --stored 1000000 \
        --messages 100000 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aio_pika
import httpx
import sqlalchemy as sa
from ingest import (
    ADMIN_URL_ENV,
    DEFAULT_ADMIN_URL,
    DEFAULT_REPEAT_SHARE,
    Instruments,
    Message,
    Result,
    checkpoint,
    environment,
    generate_messages,
    measure,
    postmaster_pid,
    process_cpu_seconds,
    process_tree_cpu_seconds,
    scratch_database,
    server_tree_cpu_seconds,
    table_state,
    timed_parse,
    write_path,
)
from perf_profile import milliseconds_by_function, recording
from pgserver import (
    STATEMENTS_SETTINGS,
    StatementsReading,
    StatementStats,
    add_server_arguments,
    admin_server,
    drained_tables,
    enable_statements,
    format_statements,
    read_statements,
    restart_server,
    statements_between,
)
from previous_write_path import PREVIOUS_REVISION
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from controlroom.config import IngestionSettings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import FailedMessageStatus, failed_error_imports
from controlroom.errors import tallies
from controlroom.errors.ingest import headers as h

BENCHMARKS = Path(__file__).resolve().parent
RABBITMQ_URL_ENV = "CONTROLROOM_BENCH_RABBITMQ_URL"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_MESSAGES = 100_000
QUEUE = "error"
PUBLISH_WINDOW = 1_000  # publishes in flight before waiting for their confirms
INGESTED_METRIC = "controlroom_ingested_messages"
BATCH_METRIC = "controlroom_ingestion_batch_seconds"  # a histogram: its _count is batches
SETTLED_OUTCOMES = ("failed_message", "failed_import", "retry_confirmation")  # acknowledged

# The end-to-end targets of docs/decisions.md "Throughput is measured end to end" (ratios
# measured in one run on this 2-core machine).
TARGET_VS_PREVIOUS = 2.5  # end to end / previous schema's end to end, at least
TARGET_VS_WRITE_PATH = 0.8  # end to end / write path alone, at least
TARGET_FLATNESS = 0.15  # last tenth's rate within 15 % of the first tenth's
TARGET_PEAK_RSS_MB = 300.0  # while draining 100,000 messages
TARGET_SERVE_CPU_MS = 0.7  # serve CPU per message, at most
TARGET_PG_CPU_MS = 0.8  # PostgreSQL CPU per message, at most
TARGET_TOTAL_CPU_MS = 1.0  # serve (with its worker processes) and PostgreSQL together
TARGET_MESSAGES = 100_000
STATS_FLUSH_SECONDS = 2.0  # backends flush table statistics at most once a second
TARGET_STORED_RATIO = 1.15  # CPU per message into TARGET_STORED messages / into none, at most
TARGET_STORED = 1_000_000
STORED_CHUNK_ROWS = 10_000  # stored messages generated (and written) at a time
STORED_CHUNK_WINDOW = timedelta(hours=6)  # the generator's window: each chunk's failures
STORED_STATUS_PERCENT = {FailedMessageStatus.ARCHIVED: 15, FailedMessageStatus.RESOLVED: 10}
"""The share of the stored messages (percent, by a hash of the id) an operator has
archived or resolved: the rest stay Unresolved (query.py's load: 70 % Unresolved)."""


# --- scratch broker and publishing ---------------------------------------------------------
@contextlib.contextmanager
def scratch_vhost(base_url: str) -> Iterator[str]:
    """A new RabbitMQ vhost (``rabbitmqctl``), the URL's user allowed on it; deleted with
    its queues on the way out. Yields the vhost's AMQP URL."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        raise SystemExit("rabbitmqctl not found: the benchmark makes its own vhost with it")
    vhost = f"controlroom_bench_{uuid.uuid4().hex[:12]}"
    user = httpx.URL(base_url.replace("amqp", "http", 1)).username or "guest"

    def ctl_run(*args: str) -> None:
        subprocess.run([ctl, *args], check=True, capture_output=True, timeout=120)

    ctl_run("add_vhost", vhost)
    try:
        ctl_run("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
        yield base_url.rstrip("/") + "/" + vhost
    finally:
        subprocess.run([ctl, "delete_vhost", vhost], capture_output=True, timeout=120)


def amqp_message(message: Message) -> aio_pika.Message:
    """As ``RabbitMQTransport.publish`` sends it (persistent, message id property)."""
    return aio_pika.Message(
        message.body,
        headers=dict(message.headers),
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=message.headers[h.MESSAGE_ID],
    )


async def publish(url: str, messages: Sequence[Message]) -> float:
    """Publish ``messages`` to ``QUEUE`` (declared durable), ``PUBLISH_WINDOW`` at a time
    with publisher confirms; returns the seconds it took."""
    started = time.perf_counter()
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(QUEUE, durable=True)
        exchange = channel.default_exchange
        for start in range(0, len(messages), PUBLISH_WINDOW):
            window = messages[start : start + PUBLISH_WINDOW]
            await asyncio.gather(
                *(exchange.publish(amqp_message(m), routing_key=QUEUE) for m in window)
            )
    return time.perf_counter() - started


async def queued(url: str) -> int:
    """Messages ready in ``QUEUE`` (a passive declare: never creates it)."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(QUEUE, passive=True)
        return int(queue.declaration_result.message_count or 0)


# --- following serve -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Sample:
    seconds: float  # perf_counter, midway through the /metrics request
    settled: int  # deliveries serve acknowledged (its ingested-messages counter)
    serve_cpu: float  # CPU seconds of the serve process so far
    pg_cpu: float  # CPU seconds of the scratch database's PostgreSQL processes, so far
    autovacuum_cpu: float  # of which its autovacuum workers
    server_cpu: float  # CPU seconds of the whole server (every process, reaped ones too)
    batches: int  # batches serve handled (its batch-seconds histogram's count)


@dataclass
class Drain:
    """One serve run, from the last sample before its first acknowledged batch to the
    sample that saw every message acknowledged."""

    name: str
    messages: int
    samples: list[Sample]
    peak_rss_bytes: int = 0
    rows: int = 0
    attempts: int = 0
    groups: int = 0
    endpoints: int = 0
    failed_imports: int = 0
    left_in_queue: int = -1
    load: str = ""
    notes: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    """The drained tables' rows, dead rows and sizes (``pgserver.format_table_state``)."""
    statements: list[StatementStats] = field(default_factory=list)
    """With ``--statements``: what the run's database ran from the drain's first sample
    to its last (``pgserver.statements_between``)."""
    stored: int = 0
    """Failed messages the store held before the drain (``--stored``)."""
    variant: str = ""
    """The server setting changed for this drain (``--variant``), empty for the base."""
    background: ServerWork | None = None
    """The whole server's work over the drain and the ``CHECKPOINT`` after it."""
    blocks_read: list[BlocksRead] = field(default_factory=list)
    """Blocks of each table and index the drain read from outside shared buffers."""
    updates: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Rows updated, and of those updated in place (HOT: no index entry), per table."""
    full_page_images: list[FullPageImages] = field(default_factory=list)
    """With ``--wal-by-relation``: the drain's full-page images by relation and record."""
    wal_bytes: list[WalBytes] = field(default_factory=list)
    """With ``--wal-by-relation``: the drain's WAL by relation."""
    server_functions: Counter[str] = field(default_factory=Counter)
    """With ``--server-profile``: PostgreSQL's CPU milliseconds over the drain by function
    (``perf_profile.milliseconds_by_function``)."""

    @property
    def start(self) -> Sample:
        zero = [s for s in self.samples if s.settled == 0]
        return zero[-1] if zero else self.samples[0]

    @property
    def end(self) -> Sample:
        return next(s for s in self.samples if s.settled >= self.messages)

    @property
    def seconds(self) -> float:
        return self.end.seconds - self.start.seconds

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds

    def serve_ms_per_message(self) -> float:
        return 1000 * (self.end.serve_cpu - self.start.serve_cpu) / self.messages

    def pg_ms_per_message(self) -> float:
        return 1000 * (self.end.pg_cpu - self.start.pg_cpu) / self.messages

    def autovacuum_ms_per_message(self) -> float:
        return 1000 * (self.end.autovacuum_cpu - self.start.autovacuum_cpu) / self.messages

    def total_ms_per_message(self) -> float:
        """serve (its worker processes too) and the database's PostgreSQL processes."""
        return self.serve_ms_per_message() + self.pg_ms_per_message()

    def mean_batch(self) -> float:
        """Messages per batch serve wrote during the drain."""
        return self.messages / max(1, self.end.batches - self.start.batches)

    def time_at(self, settled: float) -> float:
        """When the counter passed ``settled`` (linear between samples)."""
        if settled <= 0:
            return self.start.seconds
        previous = self.start
        for sample in self.samples[self.samples.index(self.start) :]:
            if sample.settled >= settled:
                if sample.settled == previous.settled:
                    return sample.seconds
                share = (settled - previous.settled) / (sample.settled - previous.settled)
                return previous.seconds + share * (sample.seconds - previous.seconds)
            previous = sample
        return self.end.seconds

    def tenths(self) -> list[float]:
        """messages/s of each tenth of the drain, first to last."""
        tenth = self.messages / 10
        times = [self.time_at(k * tenth) for k in range(11)]
        return [tenth / max(b - a, 1e-9) for a, b in itertools.pairwise(times)]


@dataclass(frozen=True, slots=True)
class ServerCounters:
    """Cluster-wide counters (``pg_stat_wal``, ``pg_stat_bgwriter``; PostgreSQL 14-16):
    a scratch server's are the run's alone."""

    wal_bytes: int
    wal_fpi: int  # full-page images: a page's first change after a checkpoint
    buffers_backend: int  # dirty buffers a backend had to write itself to reuse one
    checkpoints: int  # timed and requested (a CHECKPOINT command, or max_wal_size reached)

    @classmethod
    def read(cls, conn: sa.Connection) -> ServerCounters:
        wal_bytes, wal_fpi = conn.execute(
            sa.text("SELECT wal_bytes, wal_fpi FROM pg_stat_wal")
        ).one()
        backend, checkpoints = conn.execute(
            sa.text(
                "SELECT buffers_backend, checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
            )
        ).one()
        return cls(int(wal_bytes), int(wal_fpi), int(backend or 0), int(checkpoints))


@dataclass(frozen=True, slots=True)
class ServerWork:
    """The whole server over a drain and the ``CHECKPOINT`` after it."""

    cpu_seconds: float  # every server process: backends, background writer, checkpointer...
    wal_bytes: int
    wal_fpi: int
    buffers_backend: int
    checkpoint_seconds: float
    checkpoints: int  # during the drain, beside the CHECKPOINT after it


@dataclass(frozen=True, slots=True)
class FullPageImages:
    """Full-page images the WAL holds for one relation and kind of record over a drain
    (``pg_walinspect``), and the distinct blocks they were of."""

    relation: str
    record: str  # resource manager/record type, e.g. Btree/INSERT_LEAF
    images: int
    blocks: int


# A record's block references as PostgreSQL 15's pg_walinspect prints them: "blkref", the
# reference's number, then "rel 1663/16384/16390 fork main blk 57 (FPW); hole: ..." (a
# full-page image says "FPW").
FULL_PAGE_IMAGES_BY_RELATION = """
SELECT coalesce(c.relname, 'relfilenode ' || m[1]) AS relation,
       r.resource_manager || '/' || r.record_type AS record,
       count(*) AS images, count(DISTINCT (m[1], m[2], m[3])) AS blocks
FROM pg_get_wal_records_info(CAST(:start AS pg_lsn), CAST(:end AS pg_lsn)) AS r
CROSS JOIN LATERAL regexp_matches(
    r.block_ref, 'rel \\d+/\\d+/(\\d+) fork (\\w+) blk (\\d+) \\(FPW', 'g') AS m
LEFT JOIN pg_class c ON c.relfilenode = CAST(m[1] AS oid)
GROUP BY 1, 2 ORDER BY 3 DESC
"""


WAL_BY_RELATION = """
SELECT coalesce(c.relname, 'relfilenode ' || m[1], '(no block)') AS relation,
       count(*) AS records, sum(r.record_length) AS bytes, sum(r.fpi_length) AS image_bytes
FROM pg_get_wal_records_info(CAST(:start AS pg_lsn), CAST(:end AS pg_lsn)) AS r
CROSS JOIN LATERAL regexp_match(r.block_ref, 'rel \\d+/\\d+/(\\d+) fork') AS m
LEFT JOIN pg_class c ON c.relfilenode = CAST(m[1] AS oid)
GROUP BY 1 ORDER BY 3 DESC
"""


@dataclass(frozen=True, slots=True)
class WalBytes:
    """The WAL records of one relation over a drain (each record counted whole under the
    relation of its first block), their bytes and of those the page images' bytes."""

    relation: str
    records: int
    bytes: int
    image_bytes: int


def wal_by_relation(conn: sa.Connection, start: str, end: str) -> list[WalBytes]:
    """The WAL between LSNs ``start`` and ``end`` by relation (``WAL_BY_RELATION``), most
    bytes first."""
    return [
        WalBytes(relation, int(records), int(size), int(images or 0))
        for relation, records, size, images in conn.execute(
            sa.text(WAL_BY_RELATION), {"start": start, "end": end}
        )
    ]


WAL_KEPT = "wal_keep_size=16GB"
"""With ``--wal-by-relation``: a drain's WAL (up to about 8 GB at 1,000,000 stored) kept
past the CHECKPOINT after it, to be read."""


def wal_insert_lsn(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        return str(conn.exec_driver_sql("SELECT pg_current_wal_insert_lsn()").scalar_one())


def full_page_images(conn: sa.Connection, start: str, end: str) -> list[FullPageImages]:
    """The full-page images of the WAL between LSNs ``start`` and ``end`` by relation (of
    ``conn``'s database; others' by relfilenode) and record, most first. Needs
    ``pg_walinspect`` (PostgreSQL 15+) made in the database and a superuser."""
    return [
        FullPageImages(relation, record, int(images), int(blocks))
        for relation, record, images, blocks in conn.execute(
            sa.text(FULL_PAGE_IMAGES_BY_RELATION), {"start": start, "end": end}
        )
    ]


@dataclass(frozen=True, slots=True)
class BlocksRead:
    """One relation's blocks read from outside shared buffers (the OS cache or the disk)
    and found in them, over a drain (``pg_statio_user_indexes`` / ``_tables``)."""

    table: str
    name: str  # the index, or "(heap)" / "(TOAST)"
    read: int
    hit: int


def blocks_read(conn: sa.Connection) -> list[BlocksRead]:
    """``BlocksRead`` of every index, heap and TOAST table of ``conn``'s database (the
    counters of a database start at 0 when it is made), most blocks read first."""
    indexes = conn.execute(
        sa.text(
            "SELECT relname, indexrelname, idx_blks_read, idx_blks_hit "
            "FROM pg_statio_user_indexes WHERE idx_blks_read + idx_blks_hit > 0"
        )
    ).all()
    heaps = conn.execute(
        sa.text(
            "SELECT relname, heap_blks_read, heap_blks_hit, coalesce(toast_blks_read, 0), "
            "coalesce(toast_blks_hit, 0) FROM pg_statio_user_tables "
            "WHERE heap_blks_read + heap_blks_hit > 0"
        )
    ).all()
    found = [BlocksRead(t, i, int(r), int(h)) for t, i, r, h in indexes if r + h]
    found += [BlocksRead(t, "(heap)", int(r), int(h)) for t, r, h, _, _ in heaps]
    found += [BlocksRead(t, "(TOAST)", int(r), int(h)) for t, _, _, r, h in heaps if r + h]
    return sorted(found, key=lambda b: (-b.read, -b.hit))


class DatabaseProcesses:
    """CPU seconds of the PostgreSQL processes connected to one database (its backends
    and autovacuum workers, from ``pg_stat_activity``, read in ``/proc``): serve's work
    on the server, even while other sessions use the same server. A process that ends
    between two samples keeps its last reading; shared background processes (WAL writer,
    checkpointer) are not counted."""

    def __init__(self, admin_url: str, database: str) -> None:
        self._engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", pool_size=1)
        self._database = database
        self._latest: dict[int, float] = {}
        self._autovacuum: set[int] = set()
        self._postmaster: int | None = None

    def postmaster(self) -> int:
        """The server's postmaster (the parent of this object's own backend)."""
        if self._postmaster is None:
            with self._engine.connect() as conn:
                backend = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            self._postmaster = postmaster_pid(int(backend))
        return self._postmaster

    def server_cpu_seconds(self) -> float:
        """The whole server's CPU seconds so far (``ingest.server_tree_cpu_seconds``)."""
        return server_tree_cpu_seconds(self.postmaster())

    def counters(self) -> ServerCounters:
        with self._engine.connect() as conn:
            return ServerCounters.read(conn)

    def cpu_seconds(self) -> tuple[float, float, float]:
        """(all of them, the autovacuum workers alone, the whole server), CPU seconds so
        far."""
        server = self.server_cpu_seconds()
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT pid, backend_type FROM pg_stat_activity "
                    "WHERE datname = :database AND pid <> pg_backend_pid()"
                ),
                {"database": self._database},
            ).all()
        for pid, backend_type in rows:
            seconds = process_cpu_seconds(pid)
            if seconds:
                self._latest[pid] = seconds
                if backend_type == "autovacuum worker":
                    self._autovacuum.add(pid)
        autovacuum = sum(self._latest[pid] for pid in self._autovacuum)
        return sum(self._latest.values()), autovacuum, server

    def statements(self) -> StatementsReading:
        """``pg_stat_statements`` of this database now (``pgserver.read_statements``)."""
        with self._engine.connect() as conn:
            return read_statements(conn, self._database)

    def close(self) -> None:
        self._engine.dispose()


def read_metrics(client: httpx.Client, url: str) -> tuple[int, int] | None:
    """(deliveries acknowledged, batches handled) from serve's ``/metrics``; None until
    it answers."""
    try:
        answer = client.get(url)
    except httpx.TransportError:
        return None
    if answer.status_code != 200:
        return None
    settled = batches = 0.0
    for family in text_string_to_metric_families(answer.text):
        if family.name == INGESTED_METRIC:
            settled += sum(
                s.value
                for s in family.samples
                if s.name.endswith("_total") and s.labels.get("outcome") in SETTLED_OUTCOMES
            )
        elif family.name == BATCH_METRIC:
            batches += sum(s.value for s in family.samples if s.name.endswith("_count"))
    return int(settled), int(batches)


def peak_rss_bytes(pid: int) -> int:
    """``VmHWM`` (peak resident set) of a live process, in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as file:
        for line in file:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


class DrainFailed(RuntimeError):
    pass


def follow(
    process: subprocess.Popen[bytes],
    serve_pid: int,
    metrics_url: str,
    database: DatabaseProcesses,
    messages: int,
    *,
    poll_seconds: float,
    stall_seconds: float,
    statements: Callable[[], StatementsReading] | None = None,
    readings: list[StatementsReading] | None = None,
) -> list[Sample]:
    """Sample serve every ``poll_seconds`` until it has acknowledged ``messages``. With
    ``statements``, ``readings`` ends as [its reading at the drain's start sample, at
    its end sample] (read with each sample until the first batch is acknowledged).

    Raises ``DrainFailed`` when serve exits, or makes no progress for ``stall_seconds``.
    """
    start_reading: StatementsReading = {}
    samples: list[Sample] = []
    progress_at = time.perf_counter()
    with httpx.Client(timeout=30) as client:
        while True:
            if process.poll() is not None:
                raise DrainFailed(f"serve exited with code {process.returncode}")
            before = time.perf_counter()
            metrics = read_metrics(client, metrics_url)
            after = time.perf_counter()
            if metrics is not None:
                settled, batches = metrics
                sample = Sample(
                    (before + after) / 2,
                    settled,
                    process_tree_cpu_seconds(serve_pid),
                    *database.cpu_seconds(),
                    batches,
                )
                if not samples or settled > samples[-1].settled:
                    progress_at = after
                samples.append(sample)
                if statements is not None and readings is not None:
                    if settled == 0:
                        start_reading = statements()
                    elif settled >= messages:
                        readings[:] = [start_reading, statements()]
                if settled >= messages:
                    return samples
            if after - progress_at > stall_seconds:
                got = samples[-1].settled if samples else "no answer"
                raise DrainFailed(f"no progress for {stall_seconds:.0f} s ({got} of {messages})")
            time.sleep(max(0.0, poll_seconds - (time.perf_counter() - before)))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def child_pid(pid: int) -> int:
    """The only child of ``pid`` (serve under ``py-spy record``), waiting for it."""
    for _ in range(200):
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children:
                return int(children[0])
        time.sleep(0.05)
    raise DrainFailed("py-spy started no serve process")


def serve_environment(
    database_url: str, broker_url: str, data_dir: str, port: int, settings: Sequence[str]
) -> dict[str, str]:
    """This process's environment without any ``CONTROLROOM_*`` setting, plus serve's and
    ``settings`` (``NAME=VALUE``, each given to serve as ``CONTROLROOM_NAME``).

    The error retention period is ten years unless ``settings`` say otherwise: the loaders
    date their messages up to 30 days back, and serve's retention sweep (15 days by
    default) would otherwise purge the resolved and archived ones while they are measured.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLROOM_")}
    env["CONTROLROOM_ERROR_RETENTION_PERIOD"] = "P3650D"
    for setting in settings:
        name, _, value = setting.partition("=")
        env[f"CONTROLROOM_{name.upper()}"] = value
    env.update(
        CONTROLROOM_DATABASE_URL=database_url,
        CONTROLROOM_BROKER_URL=broker_url,
        CONTROLROOM_ERROR_QUEUE=QUEUE,
        CONTROLROOM_DATA_DIR=data_dir,
        CONTROLROOM_HOST="127.0.0.1",
        CONTROLROOM_PORT=str(port),
    )
    return env


def run_serve(
    name: str,
    command: list[str],
    *,
    admin_url: str,
    rabbitmq_url: str,
    revision: str,
    messages: Sequence[Message],
    args: argparse.Namespace,
    console: Console,
    profile: Path | None,
    template: str | None = None,
    stored: int = 0,
    variant: str = "",
) -> Drain:
    """Publish ``messages`` to a scratch vhost, then let ``command`` (a serve) drain them
    into a scratch database migrated to ``revision`` (a copy of database ``template``,
    holding ``stored`` messages, when given), the server's setting ``variant``
    (``NAME=VALUE``) changed for the drain when given; returns the followed drain."""
    database_made = copied_database(admin_url, template) if template else None
    with (
        server_setting(admin_url, variant),
        database_made or scratch_database(admin_url) as database_url,
        scratch_vhost(rabbitmq_url) as broker_url,
        tempfile.TemporaryDirectory(prefix="controlroom-bench-serve-") as data_dir,
    ):
        engine = create_store_engine(database_url, pool_size=1)
        database = DatabaseProcesses(admin_url, sa.make_url(database_url).database or "")
        try:
            with console.status(f"{name}: migrating to {revision}"):
                upgrade_database(engine, revision)
            engine.dispose()
            with console.status(f"{name}: publishing {len(messages):,} messages"):
                seconds = asyncio.run(publish(broker_url, messages))
            console.print(
                f"{name}: published {len(messages):,} messages in {seconds:.1f} s "
                f"({len(messages) / seconds:,.0f}/s) before serve started"
            )
            port = free_port()
            log_path = Path(data_dir) / "serve.log"
            if profile is not None:
                profile.mkdir(parents=True, exist_ok=True)
                out = profile / (name.replace(" ", "-").replace("'", "") + ".txt")
                command = [
                    *_py_spy(),
                    "record",
                    "--subprocesses",  # the intake workers (docs/design.md "Process shape")
                    "--nonblocking",
                    "--rate",
                    "100",
                    "--function",
                    "--format",
                    "raw",
                    "--output",
                    str(out),
                    "--",
                    *command,
                ]
            if args.warm_indexes:
                with console.status(f"{name}: reading the indexes into shared buffers"):
                    warmed, warm_seconds = prewarm_indexes(engine)
                console.print(
                    f"{name}: {warmed / 2**20:,.0f} MiB of indexes read into shared buffers "
                    f"in {warm_seconds:.0f} s (pg_prewarm), before the drain's clock"
                )
            if args.wal_by_relation:
                with engine.connect() as conn:
                    conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                        "CREATE EXTENSION IF NOT EXISTS pg_walinspect"
                    )
            checkpoint(engine)  # every drain starts right after one, empty or not
            start_lsn = wal_insert_lsn(engine)
            engine.dispose()
            counters_before = database.counters()
            neighbours = busy_neighbours(args.busy)
            load = _load()
            with open(log_path, "wb") as log:
                process = subprocess.Popen(
                    command,
                    env=serve_environment(
                        database_url, broker_url, data_dir, port, args.serve_setting
                    ),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=data_dir,
                )
            serve_pid = None
            perf_data = (
                args.server_profile / (name.replace(" ", "-").replace(",", "") + ".perf.data")
                if args.server_profile
                else None
            )
            try:
                serve_pid = child_pid(process.pid) if profile else process.pid
                readings: list[StatementsReading] = []
                with (
                    recording(perf_data) if perf_data else contextlib.nullcontext(),
                    console.status(f"{name}: serve draining {len(messages):,} messages"),
                ):
                    samples = follow(
                        process,
                        serve_pid,
                        f"http://127.0.0.1:{port}/metrics",
                        database,
                        len(messages),
                        poll_seconds=args.poll_seconds,
                        stall_seconds=args.stall_seconds,
                        statements=database.statements if args.statements else None,
                        readings=readings,
                    )
                drain = Drain(
                    name,
                    len(messages),
                    samples,
                    peak_rss_bytes(serve_pid),
                    stored=stored,
                    variant=variant,
                )
                if readings:
                    drain.statements = statements_between(*readings)
                if perf_data:
                    drain.server_functions = milliseconds_by_function(perf_data)
                drain.load = f"{load} before, {_load()} after"
            except BaseException:
                _stop(process, serve_pid)
                console.print(f"[red]{name} failed[/]; the end of serve's log:")
                console.print(log_path.read_text(errors="replace")[-4000:], markup=False)
                raise
            finally:
                for neighbour in neighbours:
                    neighbour.kill()
                    neighbour.wait()
            code = _stop(process, serve_pid)
            if code not in (0, None):
                drain.notes.append(f"serve exited with code {code} after SIGTERM")
            # The run's dirty pages flushed, and counted with it: the checkpointer's work.
            flush_started = time.perf_counter()
            checkpoint(engine)
            flush_seconds = time.perf_counter() - flush_started
            counters = database.counters()
            end_lsn = wal_insert_lsn(engine)
            drain.background = ServerWork(
                database.server_cpu_seconds() - drain.start.server_cpu,
                counters.wal_bytes - counters_before.wal_bytes,
                counters.wal_fpi - counters_before.wal_fpi,
                counters.buffers_backend - counters_before.buffers_backend,
                flush_seconds,
                counters.checkpoints - counters_before.checkpoints - 1,
            )
            drain.left_in_queue = asyncio.run(queued(broker_url))
            engine = create_store_engine(database_url, pool_size=1)
            time.sleep(STATS_FLUSH_SECONDS)  # serve's backends have flushed their statistics
            with engine.connect() as conn:  # before the reads below add their own blocks
                drain.blocks_read = blocks_read(conn)
                drain.updates = {
                    table: (int(updated), int(hot))
                    for table, updated, hot in conn.exec_driver_sql(
                        "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                        "WHERE n_tup_upd > 0 ORDER BY n_tup_upd DESC"
                    )
                }
            drain.rows, drain.attempts, drain.groups, drain.endpoints = table_state(engine)
            with engine.connect() as conn:
                drain.failed_imports = conn.execute(
                    sa.select(sa.func.count()).select_from(failed_error_imports)
                ).scalar_one()
                drain.tables = drained_tables(conn)
                if args.wal_by_relation:
                    with console.status(f"{name}: reading the drain's WAL (pg_walinspect)"):
                        drain.full_page_images = full_page_images(conn, start_lsn, end_lsn)
                        drain.wal_bytes = wal_by_relation(conn, start_lsn, end_lsn)
            engine.dispose()
            drain.notes += log_warnings(log_path)
            if profile is not None:
                summarize_profile(console, out)
            return drain
        finally:
            database.close()
            engine.dispose()


def busy_neighbours(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` busy loops, each in a session of its own at nice 0, as other users'
    programs run beside serve (a machine busy with other work); the caller kills them."""
    loop = [sys.executable, "-c", "while True: pass"]
    return [subprocess.Popen(loop, start_new_session=True) for _ in range(count)]


@contextlib.contextmanager
def server_setting(admin_url: str, setting: str) -> Iterator[None]:
    """The server's ``setting`` (``NAME=VALUE``) changed by ``ALTER SYSTEM`` and reset on
    the way out, each time applied by a reload, or by a restart (``pgserver.restart_server``:
    a scratch server's) for a setting only a start applies (``pg_settings.context`` is
    ``postmaster``: ``huge_pages``); nothing when empty."""
    if not setting:
        yield
        return
    name, value = setting.split("=", 1)
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)

    def apply(statement: str) -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(statement)
            context = conn.exec_driver_sql(
                "SELECT context FROM pg_settings WHERE name = %s", (name,)
            ).scalar_one()
            if context != "postmaster":
                conn.exec_driver_sql("SELECT pg_reload_conf()")
        if context == "postmaster":
            restart_server(admin_url)

    try:
        with admin.connect() as conn:
            literal = conn.exec_driver_sql("SELECT quote_literal(%s)", (value,)).scalar_one()
        apply(f"ALTER SYSTEM SET {name} = {literal}")
        yield
    finally:
        apply(f"ALTER SYSTEM RESET {name}")
        admin.dispose()


# --- a store that already holds messages (--stored) ----------------------------------------
def prewarm_indexes(engine: sa.Engine) -> tuple[int, float]:
    """Read every index of the store's tables into shared buffers (``pg_prewarm``, made
    in the database first), as a store that has served for a while holds them; returns
    (bytes read, seconds). The heap is left cold: a drain appends to it."""
    started = time.perf_counter()
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        blocks = conn.exec_driver_sql(
            "SELECT coalesce(sum(pg_prewarm(c.oid::regclass)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'i'"
        ).scalar_one()
        block_size = int(conn.exec_driver_sql("SHOW block_size").scalar_one())
        # pg_prewarm's reads count as the indexes' blocks read: the drain's own start at 0.
        conn.exec_driver_sql("SELECT pg_stat_reset()")
    return int(blocks) * block_size, time.perf_counter() - started


@contextlib.contextmanager
def copied_database(admin_url: str, template: str) -> Iterator[str]:
    """A new database copied from database ``template`` (``CREATE DATABASE ... TEMPLATE``,
    its files copied: ``STRATEGY FILE_COPY`` on PostgreSQL 15+, which would otherwise
    write the whole copy to the WAL); dropped on the way out (the admin connection
    checked first: the server may have restarted meanwhile). Yields its URL."""
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    name = f"controlroom_bench_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            version = int(conn.exec_driver_sql("SHOW server_version_num").scalar_one())
            strategy = " STRATEGY FILE_COPY" if version >= 150000 else ""
            conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{template}"{strategy}')
        try:
            yield sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


@contextlib.contextmanager
def stored_template(
    admin_url: str,
    stored: int,
    ingestion: IngestionSettings,
    console: Console,
    *,
    repeat_share: float,
    seed: int,
) -> Iterator[tuple[str, str]]:
    """A database holding ``stored`` failed messages as production would (``fill_store``),
    closed to connections so that it can be copied; dropped on the way out. Yields its name
    and a description of its content."""
    with scratch_database(admin_url) as url:
        engine = create_store_engine(url, pool_size=max(2, ingestion.concurrent_batches))
        try:
            upgrade_database(engine)
            started = time.perf_counter()
            fill_store(engine, stored, ingestion, console, repeat_share=repeat_share, seed=seed)
            seconds = time.perf_counter() - started
            rows, attempts, groups, endpoints = table_state(engine)
            with engine.connect() as conn:
                size = conn.exec_driver_sql(
                    "SELECT pg_size_pretty(pg_database_size(current_database()))"
                ).scalar_one()
                indexes = conn.exec_driver_sql(
                    "SELECT pg_size_pretty(pg_indexes_size('failed_messages') "
                    "+ pg_indexes_size('failed_message_groups'))"
                ).scalar_one()
                statuses = conn.exec_driver_sql(
                    "SELECT status, count(*) FROM failed_messages GROUP BY status ORDER BY status"
                ).all()
        finally:
            engine.dispose()
        name = sa.make_url(url).database or ""
        admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:  # no autovacuum worker may hold it when it is copied
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        admin.dispose()
        shares = ", ".join(f"{FailedMessageStatus(s).name.lower()} {n:,}" for s, n in statuses)
        description = (
            f"{rows:,} failed messages ({shares}) holding {attempts:,} attempts, {groups:,} "
            f"group rows, {endpoints:,} endpoints, {size} (the indexes of failed_messages "
            f"and failed_message_groups: {indexes}); written by the write path in "
            f"{seconds / 60:.1f} minutes, then VACUUM ANALYZE and CHECKPOINT"
        )
        console.print(f"stored store: {description}")
        yield name, description


def fill_store(
    engine: sa.Engine,
    stored: int,
    ingestion: IngestionSettings,
    console: Console,
    *,
    repeat_share: float,
    seed: int,
) -> None:
    """Write ``stored`` failed messages (about: whole chunks) into ``engine``'s store as
    serve would have over the weeks before: ``ingest.py``'s generator in chunks of
    ``STORED_CHUNK_ROWS`` messages, each chunk's failures in the 6 hours after the
    previous chunk's, the last ending a day before now (the drained backlog fails in the
    last 6 hours), written by the write path with production's batch size and
    concurrency. Then ``STORED_STATUS_PERCENT`` of them archived or resolved (one
    ``UPDATE``, the triggers passing it to the group rows and counters), the counters
    folded (``tallies.fold_deltas``), ``VACUUM ANALYZE`` and a ``CHECKPOINT``."""
    per_chunk = math.ceil(STORED_CHUNK_ROWS / (1 - repeat_share))
    chunks = math.ceil(stored / STORED_CHUNK_ROWS)
    first = datetime.now(UTC) - timedelta(days=1) - STORED_CHUNK_WINDOW * chunks
    for chunk in range(chunks):
        with console.status(f"storing messages: chunk {chunk + 1} of {chunks}"):
            messages = generate_messages(
                per_chunk,
                repeat_share=repeat_share,
                seed=seed + 1_000 + chunk,
                now=first + STORED_CHUNK_WINDOW * (chunk + 1),
            )
            attempts, _ = timed_parse(messages)
            write_path(engine, attempts, ingestion.batch_size, ingestion.concurrent_batches)
    cases = []
    low = 0
    for status, percent in STORED_STATUS_PERCENT.items():
        cases.append(f"WHEN bucket < {low + percent} THEN {int(status)}")
        low += percent
    with console.status("archiving and resolving a share of the stored messages"):
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"UPDATE failed_messages f SET status = CASE {' '.join(cases)} END, "
                "status_changed_at = f.last_failure_at + interval '1 hour', "
                "last_modified = f.last_failure_at + interval '1 hour' "
                "FROM (SELECT id, abs(mod(hashtext(id), 100)) AS bucket FROM failed_messages) s "
                f"WHERE s.id = f.id AND s.bucket < {low}"
            )
        tallies.fold_deltas(engine)
    with console.status("VACUUM ANALYZE and CHECKPOINT of the stored messages"):
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql("VACUUM ANALYZE")
        checkpoint(engine)


def _stop(process: subprocess.Popen[bytes], serve_pid: int | None = None) -> int | None:
    """SIGTERM to serve (its orderly stop; under py-spy, ``serve_pid`` is py-spy's child
    and py-spy writes its profile when serve has exited), SIGKILL to ``process`` after
    60 s; returns ``process``'s exit code."""
    if process.poll() is None:
        os.kill(serve_pid or process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if serve_pid and serve_pid != process.pid and Path(f"/proc/{serve_pid}").exists():
        os.kill(serve_pid, signal.SIGKILL)  # py-spy gone first: never leave serve behind
    return process.returncode


def log_warnings(log_path: Path, shown: int = 3) -> list[str]:
    """The first ``shown`` WARNING/ERROR lines of serve's log, and how many there were."""
    lines = [
        line
        for line in log_path.read_text(errors="replace").splitlines()
        if " WARNING " in line or " ERROR " in line
    ]
    if not lines:
        return []
    return [f"serve logged {len(lines)} warnings/errors, first: {lines[0][:200]}"] + [
        f"  {line[:200]}" for line in lines[1:shown]
    ]


def _load() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def _py_spy() -> list[str]:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
    return [found]


# Frames every sample passes through (threads, the event loop, the CLI): left out of the
# inclusive table, so it shows what the work is.
_PLUMBING = (
    "threading.py",
    "concurrent/",
    "asyncio/",
    "typer/",
    "click/",
    "controlroom/cli.py",
    "controlroom/server.py",
    "<frozen",
)


def _frame_file(frame: str) -> str:
    """``'function (path/file.py:line)'`` -> ``'path/file.py'``."""
    return frame.rpartition("(")[2].rpartition(":")[0]


def summarize_profile(console: Console, path: Path, top: int = 20) -> None:
    """Where serve's CPU went, from py-spy's raw (collapsed) output, one ``frame;frame;...
    count`` line per stack: self time by package, then the functions most samples were
    in (inclusive, without the plumbing every sample passes through) and on top of."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        for frame in set(frames):
            if not _frame_file(frame).startswith(_PLUMBING) and "<module>" not in frame:
                inclusive[frame] += count
        own[frames[-1]] += count
        packages[_frame_file(frames[-1]).split("/")[0].removesuffix(".py")] += count
    if not total:
        console.print(f"[yellow]{path}: no samples[/]")
        return
    console.print(f"[bold]py-spy: where serve's CPU went[/] ({total:,} samples, {path})")
    console.print(
        "  self time by package: "
        + ", ".join(f"{name} {count / total:.0%}" for name, count in packages.most_common(12))
    )
    for title, counts in (("inclusive", inclusive), ("self", own)):
        table = Table(title=f"py-spy: most {title} time")
        table.add_column(title, justify="right")
        table.add_column("function (file:first line)")
        for frame, count in counts.most_common(top):
            table.add_row(f"{count / total:.1%}", frame)
        console.print(table)


# --- report --------------------------------------------------------------------------------
def _verdict(ok: bool) -> str:
    return "[green]met[/]" if ok else "[red]missed[/]"


def report(
    console: Console,
    env: dict[str, str],
    write: Result,
    drains: Sequence[Drain],
    *,
    unique: int,
    with_previous: bool,
) -> None:
    info = Table.grid(padding=(0, 2))
    for key, value in env.items():
        info.add_row(f"[bold]{key}[/]", value)
    console.print(info)
    table = Table(title="End to end: serve draining a pre-filled error queue (RabbitMQ -> PG)")
    for name in (
        "run",
        "messages/s",
        "first 10 %",
        "last 10 %",
        "peak RSS",
        "serve/client CPU ms/msg",
        "PG CPU ms/msg",
        "seconds",
        "rows / attempts / groups / endpoints / imports / left in queue",
    ):
        table.add_column(name, justify="left" if name == "run" else "right")
    table.add_row(
        f"write path alone, {write.name}",
        f"{write.per_second:,.0f}",
        "",
        "",
        "",
        f"{1000 * write.cpu_seconds / write.messages:.2f}",
        f"{1000 * write.server_cpu_seconds / write.messages:.2f}",
        f"{write.seconds:.1f}",
        f"{write.rows:,} / {write.attempts:,} / {write.groups:,} / {write.endpoints:,}",
    )
    for drain in drains:
        tenths = drain.tenths()
        table.add_row(
            drain.name,
            f"{drain.per_second:,.0f}",
            f"{tenths[0]:,.0f}",
            f"{tenths[-1]:,.0f}",
            f"{drain.peak_rss_bytes / 2**20:,.0f} MB",
            f"{drain.serve_ms_per_message():.2f}",
            f"{drain.pg_ms_per_message():.2f}",
            f"{drain.seconds:.1f}",
            f"{drain.rows:,} / {drain.attempts:,} / {drain.groups:,} / {drain.endpoints:,} / "
            f"{drain.failed_imports:,} / {drain.left_in_queue:,}",
        )
    console.print(table)
    console.print(
        f"Expected end state: {unique:,} rows holding {write.messages:,} attempts, as the write "
        "path alone; no failed imports; nothing left in the queue. serve CPU: the serve "
        "process and its intake worker processes (all threads) from the drain's first to "
        "its last sample; the write path alone: this process's CPU. PG CPU: the backends "
        "of the run's database (end to end: and its autovacuum workers)."
    )
    for drain in drains:
        rates = "  ".join(f"{rate:,.0f}" for rate in drain.tenths())
        console.print(f"{drain.name}, messages/s by tenth of the drain: {rates}")
        console.print(
            f"  load average (1, 5, 15 min): {drain.load}; {drain.mean_batch():.0f} messages "
            f"per batch on average; autovacuum {drain.autovacuum_ms_per_message():.2f} ms of "
            "the PG CPU per message"
        )
        for note in drain.notes:
            console.print(f"  [yellow]{note}[/]")
        console.print(f"{drain.name}, the tables after the drain:")
        for line in drain.tables:
            console.print(f"  {line}", markup=False)
        if drain.statements:
            console.print(
                f"{drain.name}, the statements of the run's database over the drain "
                "(pg_stat_statements, most time first; time is wall clock, waits included):"
            )
            for line in format_statements(drain.statements, drain.messages):
                console.print(f"  {line}", markup=False)
    print_targets(console, write, drains, with_previous=with_previous)


def print_targets(
    console: Console, write: Result, drains: Sequence[Drain], *, with_previous: bool
) -> None:
    """Every end-to-end figure as a ratio, beside its target; ``drains`` alternate today's
    serve and the previous schema's when ``with_previous``."""
    current = drains[0]
    lines = []
    if with_previous:
        previous = drains[1]
        ratio = current.per_second / previous.per_second
        lines.append(
            f"end to end / today's serve with the previous schema + writer: {ratio:.2f}x "
            f"(target >= "
            f"{TARGET_VS_PREVIOUS}x: {_verdict(ratio >= TARGET_VS_PREVIOUS)}); CPU per message, "
            f"serve {current.serve_ms_per_message():.2f} vs {previous.serve_ms_per_message():.2f}"
            f" ms ({current.serve_ms_per_message() / previous.serve_ms_per_message():.2f}x), "
            f"PostgreSQL {current.pg_ms_per_message():.2f} vs {previous.pg_ms_per_message():.2f}"
            f" ms ({current.pg_ms_per_message() / previous.pg_ms_per_message():.2f}x)"
        )
    ratio = current.per_second / write.per_second
    write_client_ms = 1000 * write.cpu_seconds / write.messages
    lines.append(
        f"end to end / write path alone: {ratio:.2f}x (target >= {TARGET_VS_WRITE_PATH}x: "
        f"{_verdict(ratio >= TARGET_VS_WRITE_PATH)}); serve CPU / write path client CPU per "
        f"message: {current.serve_ms_per_message() / write_client_ms:.2f}x"
    )
    for drain in drains:
        tenths = drain.tenths()
        flat = tenths[-1] / tenths[0]
        lines.append(
            f"{drain.name}: last tenth / first tenth of the drain: {flat:.2f}x (target within "
            f"{TARGET_FLATNESS:.0%}: {_verdict(abs(flat - 1) <= TARGET_FLATNESS)})"
        )
    rss = current.peak_rss_bytes / 2**20
    scale = "" if current.messages == TARGET_MESSAGES else f" (measured at {current.messages:,})"
    lines.append(
        f"peak RSS / target: {rss / TARGET_PEAK_RSS_MB:.2f}x ({rss:,.0f} of "
        f"{TARGET_PEAK_RSS_MB:.0f} MB{scale}: {_verdict(rss <= TARGET_PEAK_RSS_MB)})"
    )
    serve_ms, pg_ms = current.serve_ms_per_message(), current.pg_ms_per_message()
    total_ms = serve_ms + pg_ms
    lines.append(
        f"serve and PostgreSQL CPU per message / target: {total_ms / TARGET_TOTAL_CPU_MS:.2f}x "
        f"({total_ms:.2f} of {TARGET_TOTAL_CPU_MS} ms: {_verdict(total_ms <= TARGET_TOTAL_CPU_MS)})"
    )
    lines.append(
        f"serve CPU per message / target: {serve_ms / TARGET_SERVE_CPU_MS:.2f}x ({serve_ms:.2f} "
        f"of {TARGET_SERVE_CPU_MS} ms: {_verdict(serve_ms <= TARGET_SERVE_CPU_MS)})"
    )
    lines.append(
        f"PostgreSQL CPU per message / target: {pg_ms / TARGET_PG_CPU_MS:.2f}x ({pg_ms:.2f} of "
        f"{TARGET_PG_CPU_MS} ms: {_verdict(pg_ms <= TARGET_PG_CPU_MS)})"
    )
    for line in lines:
        console.print(f"[bold]{line}[/]")


# --- main ----------------------------------------------------------------------------------
def measure_write_path(
    admin_url: str,
    messages: Sequence[Message],
    ingestion: IngestionSettings,
    console: Console,
    *,
    statements: bool = False,
) -> tuple[Result, dict[str, str], int]:
    """The write path alone over ``messages`` (parsed first, untimed), as ``ingest.py``
    measures it; returns its result, the environment and the number of distinct ids.
    With ``statements``, prints what its database ran during the timed run
    (``pg_stat_statements``)."""
    with console.status("parsing (for the write path alone)"):
        attempts, _ = timed_parse(messages)
    batch_size, threads = ingestion.batch_size, ingestion.concurrent_batches
    with scratch_database(admin_url) as url:
        engine = create_store_engine(url, pool_size=max(2, threads))
        try:
            upgrade_database(engine)
            env = environment(engine)
            engine.dispose()  # every connection from here on is one Instruments sees
            instruments = Instruments(engine)
            name = f"{threads} batches at once"
            readings: list[StatementsReading] = []
            database = sa.make_url(url).database
            admin = sa.create_engine(admin_url, pool_size=1)

            def timed() -> None:
                if statements:
                    with admin.connect() as conn:
                        readings.append(read_statements(conn, database))
                write_path(engine, attempts, batch_size, threads)
                if statements:
                    with admin.connect() as conn:
                        readings.append(read_statements(conn, database))

            with console.status(f"write path alone, {name}"):
                write = measure(
                    name,
                    engine,
                    timed,
                    warm_up=lambda: write_path(engine, attempts[:200], batch_size, threads),
                    messages=len(attempts),
                    instruments=instruments,
                )
            admin.dispose()
            if readings:
                console.print(
                    "write path alone, the statements of its database over the timed run "
                    "(pg_stat_statements, most time first; time is wall clock):"
                )
                for line in format_statements(statements_between(*readings), len(attempts)):
                    console.print(f"  {line}", markup=False)
        finally:
            engine.dispose()
    return write, env, len({attempt.unique_message_id for attempt in attempts})


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--messages",
        type=int,
        default=DEFAULT_MESSAGES,
        help="messages queued before serve starts (default %(default)s, the target's)",
    )
    parser.add_argument("--repeat-share", type=float, default=DEFAULT_REPEAT_SHARE)
    parser.add_argument("--seed", type=int, default=2, help="generator seed (default 2)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="drains of each serve, alternating the order between rounds; with more than "
        "one, the ratio to the baseline per round, its median and range (default "
        "%(default)s)",
    )
    parser.add_argument(
        "--stored",
        type=int,
        default=0,
        metavar="N",
        help="instead of the previous schema's serve: the same drain into a store already "
        "holding N failed messages (written once by the write path), beside the drain into "
        "an empty one, and the ratio of their CPU per message (target <= 1.15x at 1,000,000)",
    )
    parser.add_argument(
        "--warm-indexes",
        action="store_true",
        help="before each drain, read the store's indexes into shared buffers (pg_prewarm), "
        "as a store that has served a while holds them; needs shared_buffers above their size",
    )
    parser.add_argument(
        "--wal-by-relation",
        action="store_true",
        help="with --scratch-server: count each drain's full-page images by relation and "
        "record from its WAL (pg_walinspect, PostgreSQL 15+); reading it takes a while",
    )
    parser.add_argument(
        "--variant",
        default="",
        metavar="NAME=VALUE",
        help="with --stored and --scratch-server: each round also drains both stores with "
        "this server setting changed (applied by a reload, e.g. wal_compression=lz4, or by "
        "a restart of the scratch server, e.g. huge_pages=on), and prints its ratios beside "
        "the base's",
    )
    parser.add_argument(
        "--no-previous",
        action="store_true",
        help="skip today's serve with the previous schema and writer",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="N busy loops, each a session of its own, from before serve starts until its "
        "drain ends: a machine busy with other work (their CPU is in no figure)",
    )
    parser.add_argument("--poll-seconds", type=float, default=0.5, help="sampling interval")
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=300.0,
        help="give up when serve acknowledges nothing for this long (default %(default)s)",
    )
    parser.add_argument(
        "--serve-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for both serves, as CONTROLROOM_NAME (e.g. INGESTION__PREFETCH=600); "
        "repeatable; for experiments, not the target figures",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run serve under `py-spy record` (raw stacks into DIR) and print where its CPU "
        "went; the figures of such a run include py-spy's sampling",
    )
    parser.add_argument(
        "--server-profile",
        type=Path,
        metavar="DIR",
        help="sample the whole machine's CPU with perf during each drain (recordings into "
        "DIR) and print PostgreSQL's CPU per message by function; with --stored, into the "
        "stored store beside into the empty one",
    )
    parser.add_argument(
        "--statements",
        action="store_true",
        help="with --scratch-server: load pg_stat_statements (track=all) and print what "
        "each run's database ran, per message, most time first",
    )
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    if args.messages < 1_000:
        parser.error("--messages must be at least 1000")
    if args.statements:
        if not args.scratch_server:
            parser.error("--statements needs --scratch-server (pg_stat_statements loaded)")
        args.scratch_setting = [*STATEMENTS_SETTINGS, *args.scratch_setting]
    if args.variant:
        if not (args.stored and args.scratch_server):
            parser.error("--variant needs --stored and --scratch-server")
        if not re.fullmatch(r"[a-z_]+=\S+", args.variant):
            parser.error("--variant takes NAME=VALUE, a server setting's name")
    if args.wal_by_relation:
        if not args.scratch_server:
            parser.error("--wal-by-relation needs --scratch-server (its WAL kept for reading)")
        # The CHECKPOINT after a drain would recycle the segments the drain wrote.
        args.scratch_setting = [WAL_KEPT, *args.scratch_setting]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with admin_server(args, os.environ.get(ADMIN_URL_ENV) or DEFAULT_ADMIN_URL) as admin_url:
        return run(args, admin_url)


def run(args: argparse.Namespace, admin_url: str) -> int:
    """The write path alone, then each serve, on the server of ``admin_url``."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=170)
    rabbitmq_url = os.environ.get(RABBITMQ_URL_ENV) or DEFAULT_RABBITMQ_URL
    ingestion = IngestionSettings()
    with console.status("generating messages"):
        messages = generate_messages(
            args.messages, repeat_share=args.repeat_share, seed=args.seed, now=datetime.now(UTC)
        )
    if args.statements:
        admin = sa.create_engine(admin_url, pool_size=1)
        with admin.connect() as conn:
            enable_statements(conn)
        admin.dispose()
    write, env, unique = measure_write_path(
        admin_url, messages, ingestion, console, statements=args.statements
    )
    console.print(f"write path alone: {write.per_second:,.0f} messages/s")

    serve = [str(Path(sys.executable).with_name("controlroom")), "serve"]  # the console script
    with contextlib.ExitStack() as stack:
        # (name, command, revision, template database, messages it holds, server variant)
        runs: list[tuple[str, list[str], str, str | None, int, str]] = [
            ("end to end", serve, "head", None, 0, "")
        ]
        if args.stored:
            template, env["Stored"] = stack.enter_context(
                stored_template(
                    admin_url,
                    args.stored,
                    ingestion,
                    console,
                    repeat_share=args.repeat_share,
                    seed=args.seed,
                )
            )
            runs = [
                ("into an empty store", serve, "head", None, 0, ""),
                (f"into {args.stored:,} stored", serve, "head", template, args.stored, ""),
            ]
            if args.variant:
                runs += [(f"{n}, {args.variant}", *rest[:-1], args.variant) for n, *rest in runs]
        elif not args.no_previous:
            previous = [sys.executable, str(BENCHMARKS / "previous_serve.py"), "serve"]
            name = "today's serve, previous schema + writer"
            runs.append((name, previous, PREVIOUS_REVISION, None, 0, ""))
        drains = []  # round by round, each round's drains in the order of runs
        for round_ in range(1, args.rounds + 1):
            suffix = f" (round {round_})" if args.rounds > 1 else ""
            in_round = {}
            for name, command, revision, template_name, stored, variant in (
                runs if round_ % 2 else runs[::-1]
            ):
                drain = run_serve(
                    name + suffix,
                    command,
                    admin_url=admin_url,
                    rabbitmq_url=rabbitmq_url,
                    revision=revision,
                    messages=messages,
                    args=args,
                    console=console,
                    profile=args.profile,
                    template=template_name,
                    stored=stored,
                    variant=variant,
                )
                console.print(
                    f"{drain.name}: {drain.per_second:,.0f} messages/s, "
                    f"{drain.total_ms_per_message():.2f} ms CPU per message "
                    f"(PostgreSQL {drain.pg_ms_per_message():.2f})"
                )
                in_round[name] = drain
            drains += [in_round[name] for name, *_ in runs]
    env["Workload"] = (
        f"{len(messages):,} failed messages ({unique:,} distinct ids), queued before serve "
        f"starts; batch size {ingestion.batch_size}, {ingestion.concurrent_batches} batches at "
        f"once, prefetch {ingestion.effective_prefetch}"
    )
    if args.warm_indexes:
        env["Indexes"] = "read into shared buffers before each drain (pg_prewarm)"
    if args.serve_setting:
        env["Serve settings"] = ", ".join(args.serve_setting) + " (not the defaults)"
    if args.busy:
        env["Other work"] = f"{args.busy} busy loops, each a session of its own, during each drain"
    with_previous = len(runs) > 1 and not args.stored
    report(console, env, write, drains, unique=unique, with_previous=with_previous)
    if args.stored:
        print_server_work(console, drains)
        if args.server_profile:
            print_server_functions(console, drains)
        print_stored(console, drains)
    elif args.rounds > 1 and len(runs) > 1:
        print_rounds(console, drains)
    return 0


def print_server_work(console: Console, drains: Sequence[Drain], top: int = 8) -> None:
    """Per drain, per message: the whole server's CPU over the drain and the CHECKPOINT
    after it, the WAL and its full-page images, the buffers backends wrote themselves,
    and the blocks read from outside shared buffers (the ``top`` relations by blocks
    read)."""
    table = Table(title="The server's work per message, drain and the CHECKPOINT after it")
    for name in (
        "run",
        "whole server CPU ms",
        "WAL KB",
        "full-page images",
        "backend buffer writes",
        "blocks read / hit",
        "checkpoint s",
        "checkpoints during",
    ):
        table.add_column(name, justify="left" if name == "run" else "right")
    for drain in drains:
        work, n = drain.background, drain.messages
        if work is None:
            continue
        read = sum(b.read for b in drain.blocks_read)
        hit = sum(b.hit for b in drain.blocks_read)
        table.add_row(
            drain.name,
            f"{1000 * work.cpu_seconds / n:.2f}",
            f"{work.wal_bytes / 1024 / n:.1f}",
            f"{work.wal_fpi / n:.2f}",
            f"{work.buffers_backend / n:.2f}",
            f"{read / n:.2f} / {hit / n:.0f}",
            f"{work.checkpoint_seconds:.1f}",
            f"{work.checkpoints}",
        )
    console.print(table)
    console.print(
        "Cluster-wide counters (pg_stat_wal, pg_stat_bgwriter, the server's processes): the "
        "run's own on --scratch-server only. Blocks: the run's database alone."
    )
    for drain in drains:
        reads = ", ".join(
            f"{b.table}.{b.name} {b.read / drain.messages:.2f} ({b.hit / drain.messages:.1f} hit)"
            for b in drain.blocks_read[:top]
            if b.read
        )
        console.print(f"{drain.name}, blocks read per message, most first: {reads or 'none'}")
        updates = ", ".join(
            f"{table} {updated:,} ({hot:,} HOT)" for table, (updated, hot) in drain.updates.items()
        )
        console.print(f"{drain.name}, rows updated (in place, HOT): {updates or 'none'}")
        if drain.full_page_images:
            images = ", ".join(
                f"{f.relation} {f.record} {f.images / drain.messages:.2f} "
                f"({f.blocks / drain.messages:.2f} blocks)"
                for f in drain.full_page_images[:top]
            )
            console.print(
                f"{drain.name}, full-page images per message by relation and record (distinct "
                f"blocks per message), most first: {images}"
            )
        if drain.wal_bytes:
            images_of: dict[str, int] = {}
            for f in drain.full_page_images:
                images_of[f.relation] = images_of.get(f.relation, 0) + f.images
            wal = ", ".join(
                f"{w.relation} {w.bytes / 1024 / drain.messages:.2f} KB "
                f"({w.image_bytes / 1024 / drain.messages:.2f} KB in "
                f"{images_of.get(w.relation, 0) / drain.messages:.2f} images)"
                for w in drain.wal_bytes
                if w.bytes / 1024 / drain.messages >= 0.05
            )
            console.print(
                f"{drain.name}, WAL per message by relation (a record under its first block's "
                f"relation; of it, page images), every relation from 0.05 KB: {wal}"
            )


def print_server_functions(console: Console, drains: Sequence[Drain], top: int = 30) -> None:
    """PostgreSQL's CPU per message by function into the stored and the empty store
    (medians over the rounds, microseconds), the functions whose cost grew most first:
    where the growth with the table goes (``--server-profile``)."""
    base = [d for d in drains if not d.variant]
    empty = [d for d in base if not d.stored]
    stored = [d for d in base if d.stored]

    def per_message(runs: Sequence[Drain], function: str) -> float:
        return statistics.median(d.server_functions[function] * 1000 / d.messages for d in runs)

    functions = set().union(*(d.server_functions for d in base))
    rows = sorted(
        ((per_message(stored, f), per_message(empty, f), f) for f in functions),
        key=lambda row: row[1] - row[0],
    )
    table = Table(title="PostgreSQL's CPU per message by function (perf, µs, median of rounds)")
    for column in ("into stored", "into empty", "stored - empty"):
        table.add_column(column, justify="right")
    table.add_column("function")
    totals = [sum(row[0] for row in rows), sum(row[1] for row in rows)]
    table.add_row(f"{totals[0]:.0f}", f"{totals[1]:.0f}", f"{totals[0] - totals[1]:+.0f}", "all")
    for full, none, function in rows[:top]:
        table.add_row(f"{full:.1f}", f"{none:.1f}", f"{full - none:+.1f}", function)
    console.print(table)


def print_stored(console: Console, drains: Sequence[Drain]) -> None:
    """CPU per message into the stored store / into an empty one, from the two drains of
    each round (run side by side, the order alternating between rounds): every round's
    ratio, the median and the range, beside the target."""
    variants = sorted({d.variant for d in drains})
    if len(variants) > 1:  # the base's ratios, then each variant's, then variant / base
        for variant in variants:
            console.print(f"[bold]{variant or 'the base settings'}:[/]")
            print_stored(console, [d for d in drains if d.variant == variant])
        for kind in ("empty", "stored"):
            pick = [d for d in drains if (d.stored > 0) == (kind == "stored")]
            base = [d.total_ms_per_message() for d in pick if not d.variant]
            changed = [d.total_ms_per_message() for d in pick if d.variant]
            values = [c / b for b, c in zip(base, changed, strict=True)]
            console.print(
                f"[bold]serve and PostgreSQL CPU per message into the {kind} store, "
                f"{variants[-1]} / the base, per round: {', '.join(f'{v:.2f}' for v in values)};"
                f" median {statistics.median(values):.2f}x[/]"
            )
        return
    pairs = list(zip(drains[::2], drains[1::2], strict=True))
    stored = pairs[0][1].stored
    scale = "" if stored >= TARGET_STORED else f" (measured at {stored:,}, target at 1,000,000)"

    def ratios(figure: Callable[[Drain], float]) -> list[float]:
        return [figure(full) / figure(empty) for empty, full in pairs]

    for label, figure in (
        ("serve and PostgreSQL CPU per message", Drain.total_ms_per_message),
        ("PostgreSQL CPU per message", Drain.pg_ms_per_message),
        ("serve CPU per message", Drain.serve_ms_per_message),
        (
            "whole server CPU per message (with the CHECKPOINT after)",
            lambda d: d.background.cpu_seconds if d.background else math.nan,
        ),
        ("messages/s", lambda d: d.per_second),
    ):
        values = ratios(figure)
        median = statistics.median(values)
        line = (
            f"{label}, into {stored:,} stored / into an empty store, per round: "
            f"{', '.join(f'{v:.2f}' for v in values)}; median {median:.2f}x "
            f"({min(values):.2f}-{max(values):.2f})"
        )
        if figure is Drain.total_ms_per_message:
            met = median <= TARGET_STORED_RATIO
            line += f" (target <= {TARGET_STORED_RATIO}x{scale}: {_verdict(met)})"
        console.print(f"[bold]{line}[/]")


def print_rounds(console: Console, drains: Sequence[Drain]) -> None:
    """End to end / the baseline from the two drains of each round (run side by side, the
    order alternating between rounds): every round's ratio, the median and the range."""
    pairs = list(zip(drains[::2], drains[1::2], strict=True))
    rates = [current.per_second / previous.per_second for current, previous in pairs]
    serve_cpu = [
        current.serve_ms_per_message() / previous.serve_ms_per_message()
        for current, previous in pairs
    ]
    pg_cpu = [
        current.pg_ms_per_message() / previous.pg_ms_per_message() for current, previous in pairs
    ]
    console.print(
        "[bold]end to end / today's serve with the previous schema + writer, per round: "
        f"{', '.join(f'{rate:.2f}' for rate in rates)}; median {statistics.median(rates):.2f}x "
        f"({min(rates):.2f}-{max(rates):.2f}); CPU per message, serve median "
        f"{statistics.median(serve_cpu):.2f}x, PostgreSQL {statistics.median(pg_cpu):.2f}x[/]"
    )


if __name__ == "__main__":
    sys.exit(main())
