"""Every view's p95 through real HTTP against ``controlroom serve`` over a store of a
million failed messages: idle, while serve drains a backlog at full speed, and beside busy
loops that do no database work (the CPU-only control); and serve's drain rate with and
without a reader (docs/design.md "Process shape": intake in worker processes at a lower
CPU priority than the API and the console).

Targets: every view's p95 while draining at most 1.5 x its idle p95; the drain rate with
a reader at least 0.8 x the rate without. Both stores: PostgreSQL with RabbitMQ, SQLite
with the embedded queue.

How each figure is made (``benchmarks/README.md`` has the figures):

1. **The store.** ``--reuse NAME`` (PostgreSQL: a database on the admin server; SQLite: the
   file) measures a store loaded before by ``query.py --keep`` or by this script with
   ``--keep``; without it, ``--messages`` rows are loaded with ``query.py``'s loader into a
   scratch store (``query.prepare_store``: migrated to head first, a reused store too).
   Every serve this script starts gets ``query.SERVE_KEEPS_LOADED``: the loaded rows are
   dated before ``query.NOW``, and serve's retention sweep would otherwise delete their
   Resolved and Archived quarter at start-up.
2. **The views.** ``query.py``'s scenarios (the same names, requests and answers), only
   those that are requests (``Scenario.http``), and six console pages (``console_views``).
   ``--views baseline`` (default): the 18 of ``BASELINE_VIEWS``, API and console; ``--views
   all``: every one (about 45); ``--only TEXT`` keeps those whose name contains it.
3. **The reader.** One ``httpx.Client`` holding one keep-alive connection (cookies kept:
   the console's session), serial, round robin over the views in a fixed order; a window
   runs whole rounds until ``--seconds`` have passed. By default each call starts when
   the one before has answered (a closed loop: the most a single reader can ask, the
   worst case for the drain); ``--pace SECONDS`` starts one every SECONDS (or when the one
   before answers, if later), as an operator clicking through the console paces. Each
   sample is the wall time of one view's call as ``query.measure`` times it: the request,
   the whole answer read and, for the API's JSON, decoded by the client (about 1 ms for
   the 95 KB first page). p95 is
   ``statistics.quantiles(n=20, method="inclusive")[18]`` of every sample of that view in
   the windows of one kind (``query.measure``'s). ``--warm-up`` unmeasured rounds before
   the first window of each serve.
4. **Idle and the CPU-only control** (serve A). ``controlroom serve`` with the settings of
   the drain (intake on, ``ingestion.workers`` and ``ingestion.nice`` as configured) on an
   empty queue: a scratch RabbitMQ vhost (``serve.scratch_vhost``) or an empty embedded
   queue file in a scratch data directory. Windows alternate in rounds, idle then control,
   then control then idle (``--rounds``: ``2`` gives idle, control, control, idle). A
   control window runs one busy loop per core (``os.cpu_count()``, at ``--control-nice``,
   default 0, under ``--control-scheduling``, default normal: each a ``python -c`` loop
   that touches no file, socket or database) for the whole window,
   started 1 s before it. Serve A is stopped (SIGTERM).
5. **The backlog.** ``--backlog`` messages from ``ingest.py``'s generator (about 3 KB of
   headers, a 1 KB JSON body, 10 % later attempts of an earlier message; failing in the
   6 hours before now, so newer than every loaded row: a storm on top of the store),
   generated and published ``PUBLISH_CHUNK`` at a time while no serve runs: to queue
   ``error`` of the vhost (publisher confirms, ``serve.publish``) or of the embedded
   queue file (``EmbeddedQueue.publish``, each a durable commit).
6. **The drain** (serve B: the same command, settings, port and data directory as A).
   Once its ``/metrics`` counts the first settled message, the reader's warm-up rounds,
   then windows in rounds as in 4: without a reader (the script sleeps), with the reader
   (``--rounds 2``: without, with, with, without, so a drain that slows as the table grows
   weighs on both kinds alike). The drain rate of a window: the deliveries serve settled
   (``serve.read_metrics``: ``controlroom_ingested_messages_total`` of the failed
   message, failed import and retry confirmation outcomes, from a second connection at the
   window's two ends) over its seconds. A worker sends its counters to serve every second
   (``controlroom/workers.py``), so each end may lag by up to 1 s of drain (about 2 % of a
   60 s window, the same at both ends on average). The rate of a kind is its windows'
   messages over their seconds; "with / without" is that ratio, and per round the ratio of
   its two windows. **The drain must last through every window**: the backlog left when
   the last window ended (published - settled) is printed, and a run whose backlog ran
   out (fewer left than serve's prefetch) is marked as such: the later windows were not
   at full speed.
7. **Idle after the drain** (serve C: the same command, settings, port and data
   directory). What serve B left of the backlog is purged from the error queue, and serve
   C runs ``--rounds`` idle windows on the store as the drain left it: its answers are
   the draining windows' or larger (the drain's new groups and matches among them), where
   idle before the backlog answered over the loaded rows alone. "draining / idle after"
   compares each view with itself over the same answers.
8. **Where the CPU went**, per window: serve's own process (API, console, metrics), its
   worker processes (``ingest.process_tree_cpu_seconds`` minus its own), on PostgreSQL the
   backends connected to the store's database by their nice value (the workers renice
   theirs, docs/design.md "Process shape"; ``pg_stat_activity``, then ``/proc``), this
   process (the reader, or the sleeper), and how many of the machine's cores were busy
   (``/proc/stat``, every process). Shared PostgreSQL processes (WAL writer, checkpointer,
   autovacuum launcher) are not counted. In the reader's windows, also how long serve's
   threads, the backends by nice value and this process waited on a run queue for a CPU,
   per call (``/proc/<pid>/task/<tid>/schedstat``). Where serve made intake's cgroup
   (``ingestion.own_cgroup``), the share of the window serve answered reads and the share
   of that intake's weight was down for them (serve's ``/metrics``: the weight drops for
   at most ``ingestion.yield_to_reads`` of the time).
9. **Afterwards** (unless ``--keep-drained``): what the drain stored is deleted (the rows
   whose last failure is after the store's latest before the drain, their group rows by
   cascade, the group hours after that hour; the counters follow by their triggers), and on
   PostgreSQL ``VACUUM ANALYZE`` of the tables a drain writes, so that the next run on a
   reused store measures the store as loaded. Rows and group rows before and after are
   printed. ``known_endpoints`` and the event log keep what the drain added.

Run (see ``benchmarks/README.md`` for the full-scale commands and the time they take):

    .venv/bin/python benchmarks/views_http.py --messages 20000 --backlog 20000 --seconds 10
    .venv/bin/python benchmarks/views_http.py --database sqlite --messages 20000 ...

Servers: ``CONTROLROOM_BENCH_POSTGRESQL_URL`` (an admin URL, as ``query.py``) and
``CONTROLROOM_BENCH_RABBITMQ_URL`` (as ``serve.py``; vhosts are made with ``rabbitmqctl``),
both on this machine (CPU is read from ``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import query
import sqlalchemy as sa
from ingest import Message, generate_messages, process_tree_cpu_seconds
from pgserver import (
    DRAIN_TABLES,
    add_server_arguments,
    admin_server,
    cpu_seconds,
    process_cpu_seconds,
    stat_fields,
)
from prometheus_client.parser import text_string_to_metric_families
from serve import (
    DEFAULT_RABBITMQ_URL,
    QUEUE,
    RABBITMQ_URL_ENV,
    _stop,
    free_port,
    log_warnings,
    publish,
    queued,
    read_metrics,
    scratch_vhost,
    serve_environment,
)

from controlroom.config import IngestionSettings
from controlroom.db.engine import create_store_engine
from controlroom.db.providers.sqlite import PROVIDER as SQLITE_PROVIDER
from controlroom.db.tables import failed_message_group_hours, failed_message_groups, failed_messages
from controlroom.transport import EmbeddedQueue, RabbitMQTransport
from controlroom.workers import autogroup_warning

DEFAULT_BACKLOG = 300_000
DEFAULT_SECONDS = 60.0
DEFAULT_ROUNDS = 2
DEFAULT_WARM_UP = 5  # rounds of every view before the first window of each serve
PUBLISH_CHUNK = 20_000  # messages generated and published at a time (memory)
SERVE_START_SECONDS = 120.0  # for serve to answer /metrics
DRAIN_START_SECONDS = 120.0  # for serve B to settle its first message
MIN_SAMPLES = 20  # fewer samples per view and kind: its p95 is flagged
TARGET_P95_RATIO = 1.5  # draining p95 / idle p95, at most
TARGET_DRAIN_RATIO = 0.8  # drain rate with a reader / without, at least
NICE_FIELD = 16  # of pgserver.stat_fields: /proc/<pid>/stat field 19
SPIN = (
    "import os\nos.nice({nice})\n"
    "if {idle}:\n    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
    "while True:\n    pass\n"
)

BASELINE_VIEWS = (
    "errors: first page (default sort time_sent desc)",
    "errors: status=unresolved, first page",
    "errors: endpoint Sales, first page",
    "errors/counts",
    "errors/summary",
    "search: a message id (1 hit)",
    "search: 'ChargeCreditCard07' (selective)",
    "search: 'System.InvalidOperationException' (broad)",
    "search: 'HttpRequestException 503' (two words)",
    "groups: Exception Type and Stack Trace",
    "group's messages: medium group (",
    "group's messages: biggest group (",
    "console: dashboard /",
    "console: /messages",
    "console: /messages?q=System.InvalidOperationException",
    "console: /messages?group= the biggest group",
    "console: /groups",
    "console: /endpoints",
)
"""The default views, by name (a name ending in ``(`` is a prefix: the group's size
follows it): the first pages, searches, counts, groups and a group's messages of the API,
and the console's pages."""

IDLE, CONTROL, WITHOUT, WITH = "idle", "control", "no reader", "reader"
AFTER = "idle after"  # serve C: the store as the drain left it, the backlog's rest purged


# --- the views -----------------------------------------------------------------------------
def console_views(client: httpx.Client, engine: sa.Engine) -> list[query.Scenario]:
    """The console's pages an operator opens first, through ``client`` (the open console:
    the first answer sets the session cookie the client keeps)."""

    def page(path: str, **params: Any) -> Callable[[], str]:
        def run() -> str:
            response = client.get(path, params=params)
            if response.status_code != 200:
                raise RuntimeError(f"{path} {params}: {response.status_code} {response.text[:200]}")
            return f"{len(response.content):,} bytes of HTML"

        return run

    biggest = query.group_sizes(engine)["biggest"][0]
    return [
        query.Scenario("console: dashboard /", page("/")),
        query.Scenario("console: /messages", page("/messages")),
        query.Scenario(
            "console: /messages?q=System.InvalidOperationException",
            page("/messages", q="System.InvalidOperationException"),
        ),
        query.Scenario(
            "console: /messages?group= the biggest group", page("/messages", group=biggest)
        ),
        query.Scenario("console: /groups", page("/groups")),
        query.Scenario("console: /endpoints", page("/endpoints")),
    ]


def choose_views(
    client: httpx.Client, engine: sa.Engine, messages: int, which: str, only: str | None
) -> list[query.Scenario]:
    """The measured views in their round-robin order (``BASELINE_VIEWS``' for the baseline)."""
    found = [s for s in query.scenarios(client, engine, messages) if s.http]
    found += console_views(client, engine)
    if which == "baseline":
        chosen = []
        for name in BASELINE_VIEWS:
            match = [
                s for s in found if s.name == name or (name[-1] == "(" and s.name.startswith(name))
            ]
            if len(match) != 1:
                raise SystemExit(f"view {name!r}: {len(match)} scenarios of that name")
            chosen += match
        found = chosen
    return [s for s in found if not only or only in s.name]


def p95(samples: Sequence[float]) -> float:
    """``query.measure``'s p95."""
    if len(samples) < 2:
        return samples[0] if samples else float("nan")
    return statistics.quantiles(samples, n=20, method="inclusive")[18]


def read_round_robin(
    views: Sequence[query.Scenario],
    seconds: float,
    samples: dict[str, list[float]],
    pace: float = 0.0,
) -> int:
    """Whole rounds over ``views`` until ``seconds`` have passed, each call's milliseconds
    appended to ``samples``, a call started every ``pace`` seconds (0: each as soon as
    the one before has answered); returns the rounds."""
    started = time.perf_counter()
    rounds = 0
    while True:
        for view in views:
            began = time.perf_counter()
            view.run()
            samples[view.name].append((time.perf_counter() - began) * 1000)
            time.sleep(max(0.0, began + pace - time.perf_counter()))
        rounds += 1
        if time.perf_counter() - started >= seconds:
            return rounds


# --- what a window cost ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Reading:
    at: float  # perf_counter
    settled: int  # deliveries serve settled so far (0 when /metrics did not answer)
    serve_cpu: float  # serve's own process
    tree_cpu: float  # serve and its worker processes
    backends: dict[int, tuple[float, int, float]]  # pid -> (CPU s, nice, run-queue wait s)
    serve_wait: float  # seconds serve's threads waited on a run queue for a CPU
    own_wait: float  # and this process's (the reader's)
    own_cpu: float  # this process
    jiffies: tuple[int, int]  # (busy, all) of the machine
    weighed: tuple[float, float]  # seconds serve answered reads, and intake's weight was down


@dataclass
class Window:
    kind: str
    round: int
    start: Reading
    end: Reading
    rounds: int = 0  # of the reader
    samples: dict[str, list[float]] = field(default_factory=dict)
    load: str = ""

    @property
    def seconds(self) -> float:
        return self.end.at - self.start.at

    @property
    def settled(self) -> int:
        return self.end.settled - self.start.settled

    @property
    def rate(self) -> float:
        return self.settled / self.seconds

    def cpu(self) -> str:
        """Where the CPU went: seconds of each part over the window's seconds (cores)."""
        s = self.seconds
        serve = self.end.serve_cpu - self.start.serve_cpu
        workers = self.end.tree_cpu - self.start.tree_cpu - serve
        by_nice: dict[int, float] = defaultdict(float)
        waited: dict[int, float] = defaultdict(float)
        for pid, (seconds, nice, wait) in self.end.backends.items():
            before = self.start.backends.get(pid, (0.0, nice, 0.0))
            by_nice[nice] += seconds - before[0]
            waited[nice] += wait - before[2]
        busy, every = (b - a for a, b in zip(self.start.jiffies, self.end.jiffies, strict=True))
        parts = [f"serve {serve / s:.2f}", f"workers {workers / s:.2f}"]
        parts += [f"backends at nice {n} {c / s:.2f}" for n, c in sorted(by_nice.items())]
        parts.append(f"this process {(self.end.own_cpu - self.start.own_cpu) / s:.2f}")
        cores = os.cpu_count() or 1
        parts.append(f"machine {cores * busy / max(every, 1):.2f} of {cores} busy")
        reads, lowered = (b - a for a, b in zip(self.start.weighed, self.end.weighed, strict=True))
        if reads > 0:  # only where serve made intake's cgroup (ingestion.own_cgroup)
            parts.append(
                f"serve answered reads {reads / s:.2f} of the window, intake's weight down "
                f"{lowered / reads:.2f} of that"
            )
        calls = sum(len(samples) for samples in self.samples.values())
        if calls:  # how long a call's processes waited for a CPU, not what they ran
            waits = [f"serve {1000 * (self.end.serve_wait - self.start.serve_wait) / calls:.1f}"]
            waits += [
                f"backends at nice {n} {1000 * w / calls:.1f}" for n, w in sorted(waited.items())
            ]
            waits.append(
                f"this process {1000 * (self.end.own_wait - self.start.own_wait) / calls:.1f}"
            )
            parts.append(f"ms waited on a run queue per call: {', '.join(waits)}")
        return ", ".join(parts)


def run_queue_wait_seconds(pid: int) -> float:
    """Seconds the live threads of process ``pid`` have waited on a run queue for a CPU
    (``/proc/<pid>/task/<tid>/schedstat``'s second field, nanoseconds); 0 when it is gone.
    Beside a busy core, each hand-off of a call (client, serve, its thread, its backend)
    may wait for the running task's slice to end, whatever their priorities' shares."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    waited = 0
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/schedstat", encoding="ascii") as file:
                waited += int(file.read().split()[1])
        except (OSError, IndexError, ValueError):  # the thread ended meanwhile
            continue
    return waited / 1e9


class Probe:
    """Readings of one serve: its ``/metrics`` (a connection of its own, not the
    reader's), ``/proc`` of its processes and of the store's PostgreSQL backends."""

    def __init__(self, pid: int, metrics_url: str, admin_url: str | None, database: str) -> None:
        self._pid = pid
        self._metrics_url = metrics_url
        self._client = httpx.Client(timeout=30)
        self._admin = (
            sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", pool_size=1)
            if admin_url
            else None
        )
        self._database = database

    def settled(self) -> int:
        got = read_metrics(self._client, self._metrics_url)
        return 0 if got is None else got[0]

    def weighed(self) -> tuple[float, float]:
        """(seconds serve answered reads, seconds intake's weight was down for them) from
        serve's ``/metrics`` (``runtime.reads_first.WeighIntake``); zeros without them."""
        try:
            text = self._client.get(self._metrics_url).text
        except httpx.TransportError:
            return 0.0, 0.0
        found = {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }
        return (
            found.get("controlroom_intake_weight_reads_seconds_total", 0.0),
            found.get("controlroom_intake_weight_lowered_seconds_total", 0.0),
        )

    def backends(self) -> dict[int, tuple[float, int, float]]:
        if self._admin is None:
            return {}
        with self._admin.connect() as conn:
            pids = conn.execute(
                sa.text(
                    "SELECT pid FROM pg_stat_activity "
                    "WHERE datname = :database AND pid <> pg_backend_pid()"
                ),
                {"database": self._database},
            ).scalars()
            found = {}
            for pid in pids:
                if (fields := stat_fields(pid)) is not None:
                    nice = int(fields[NICE_FIELD])
                    found[pid] = (cpu_seconds(fields), nice, run_queue_wait_seconds(pid))
        return found

    def read(self) -> Reading:
        return Reading(
            time.perf_counter(),
            self.settled(),
            process_cpu_seconds(self._pid),
            process_tree_cpu_seconds(self._pid),
            self.backends(),
            run_queue_wait_seconds(self._pid),
            run_queue_wait_seconds(os.getpid()),
            time.process_time(),
            query._cpu_jiffies(),
            self.weighed(),
        )

    def close(self) -> None:
        self._client.close()
        if self._admin is not None:
            self._admin.dispose()


def window_order(rounds: int, first: str, second: str) -> list[tuple[int, str]]:
    """(round, kind) of every window: ``first, second`` in odd rounds, reversed in even
    ones (A B B A ...), so a drift over the run weighs on both kinds alike."""
    order = []
    for number in range(1, rounds + 1):
        pair = (first, second) if number % 2 else (second, first)
        order += [(number, kind) for kind in pair]
    return order


def run_windows(
    probe: Probe,
    views: Sequence[query.Scenario],
    order: Sequence[tuple[int, str]],
    seconds: float,
    control_nice: int,
    control_scheduling: str,
    pace: float,
) -> list[Window]:
    windows = []
    for number, kind in order:
        spinners: list[subprocess.Popen[bytes]] = []
        if kind == CONTROL:
            spin = SPIN.format(nice=control_nice, idle=control_scheduling == "idle")
            spinners = [
                subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 1)
            ]
            time.sleep(1)
        try:
            start = probe.read()
            samples: dict[str, list[float]] = {view.name: [] for view in views}
            rounds = 0
            if kind == WITHOUT:
                time.sleep(seconds)
            else:
                rounds = read_round_robin(views, seconds, samples, pace)
            end = probe.read()
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
        window = Window(kind, number, start, end, rounds, samples, query.load_average())
        windows.append(window)
        print(
            f"  round {number}, {kind}: {window.seconds:.1f} s, {rounds} rounds of the views, "
            f"{window.settled:,} messages settled ({window.rate:,.0f}/s); {window.cpu()}; "
            f"{window.load}",
            flush=True,
        )
    return windows


# --- serve, the backlog ----------------------------------------------------------------------
@dataclass
class Serve:
    process: subprocess.Popen[bytes]
    log_path: Path


@contextlib.contextmanager
def served(
    url: str, broker_url: str, data_dir: Path, port: int, settings: Sequence[str], name: str
) -> Iterator[Serve]:
    """``controlroom serve`` over ``url`` and ``broker_url`` (empty: the embedded queue of
    ``data_dir``) on ``port``, answering ``/metrics``; stopped by SIGTERM on the way out."""
    environment = serve_environment(
        url, broker_url, str(data_dir), port, [*query.SERVE_KEEPS_LOADED, *settings]
    )
    log_path = data_dir / f"serve-{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("controlroom")), "serve"],
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=data_dir,
        )
    try:
        deadline = time.monotonic() + SERVE_START_SECONDS
        with httpx.Client(timeout=30) as client:
            while read_metrics(client, f"http://127.0.0.1:{port}/metrics") is None:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"serve {name} did not start: "
                        + log_path.read_text(errors="replace")[-2000:]
                    )
                time.sleep(0.2)
        yield Serve(process, log_path)
    finally:
        code = _stop(process)
        if code not in (0, None):
            print(f"serve {name} exited with code {code} after SIGTERM")


def backlog_chunks(count: int, now: datetime) -> Iterator[list[Message]]:
    """``count`` messages of ``ingest.generate_messages``, ``PUBLISH_CHUNK`` at a time
    (each chunk its own seed: its own ids)."""
    for index, start in enumerate(range(0, count, PUBLISH_CHUNK)):
        yield generate_messages(min(PUBLISH_CHUNK, count - start), seed=100 + index, now=now)


async def publish_embedded(path: Path, messages: Sequence[Message]) -> None:
    async with EmbeddedQueue(path) as queue:
        for message in messages:
            await queue.publish(QUEUE, message.headers, message.body)


async def purge_backlog(broker_url: str, data_dir: Path) -> int:
    """Delete what is left of the backlog in the error queue; returns how many."""
    if broker_url:
        async with RabbitMQTransport(broker_url) as rabbitmq:
            return await rabbitmq.purge(QUEUE)
    async with EmbeddedQueue(data_dir / "queue.db") as embedded:
        return await embedded.purge(QUEUE)


def publish_backlog(broker_url: str, data_dir: Path, count: int) -> None:
    started = time.perf_counter()
    now = datetime.now(UTC)
    for chunk in backlog_chunks(count, now):
        if broker_url:
            asyncio.run(publish(broker_url, chunk))
        else:
            asyncio.run(publish_embedded(data_dir / "queue.db", chunk))
    where = "RabbitMQ (scratch vhost)" if broker_url else "the embedded queue"
    seconds = time.perf_counter() - started
    print(f"backlog: {count:,} messages generated and published to {where} in {seconds:.0f} s")


# --- the store before and after --------------------------------------------------------------
def store_state(engine: sa.Engine) -> tuple[int, int, datetime | None]:
    """(failed messages, group rows, the latest last failure)."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(sa.func.count()).select_from(failed_messages)).scalar_one()
        groups = conn.execute(
            sa.select(sa.func.count()).select_from(failed_message_groups)
        ).scalar_one()
        latest = conn.execute(sa.select(sa.func.max(failed_messages.c.last_failure_at))).scalar()
    return rows, groups, latest


def remove_drained(engine: sa.Engine, after: datetime) -> None:
    """Delete what failed after ``after`` (the drain's rows; group rows by cascade, the
    counters by their triggers) and the group hours past its hour; on PostgreSQL then
    ``VACUUM ANALYZE`` the tables a drain writes."""
    started = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(sa.delete(failed_messages).where(failed_messages.c.last_failure_at > after))
        conn.execute(
            sa.delete(failed_message_group_hours).where(
                failed_message_group_hours.c.hour > int(after.timestamp()) // 3600
            )
        )
    if not query.is_sqlite(str(engine.url)):
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in (*DRAIN_TABLES, failed_message_group_hours.name):
                conn.exec_driver_sql(f"VACUUM ANALYZE {table}")
    print(f"removed what the drain stored in {time.perf_counter() - started:.0f} s")


# --- the run ---------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--database", choices=("postgresql", SQLITE_PROVIDER.name), default="postgresql"
    )
    parser.add_argument(
        "--reuse",
        metavar="NAME",
        help="a store loaded before (query.py --keep, or this script's --keep): the "
        "database's name on the admin server, with --database sqlite its file",
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=query.DEFAULT_MESSAGES,
        help="rows to load without --reuse (default %(default)s)",
    )
    parser.add_argument("--workers", type=int, default=2, help="loading processes")
    parser.add_argument("--keep", action="store_true", help="keep a store this run loaded")
    parser.add_argument(
        "--sqlite-dir",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="where a loaded SQLite store's scratch directory is made",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=DEFAULT_BACKLOG,
        help="messages published before the draining serve starts (default %(default)s)",
    )
    parser.add_argument(
        "--seconds", type=float, default=DEFAULT_SECONDS, help="of each window (default 60)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help="pairs of windows per serve, the order reversed every other round (default 2)",
    )
    parser.add_argument("--warm-up", type=int, default=DEFAULT_WARM_UP, help="rounds (default 5)")
    parser.add_argument(
        "--pace",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="the reader starts a call every SECONDS, as an operator paces (default 0: "
        "each call as soon as the one before answered, the worst case)",
    )
    parser.add_argument("--views", choices=("baseline", "all"), default="baseline")
    parser.add_argument("--only", help="measure only the views whose name contains this")
    parser.add_argument(
        "--control-nice",
        type=int,
        default=0,
        help="nice of the control's busy loops (default 0; the workers' is ingestion.nice)",
    )
    parser.add_argument(
        "--control-scheduling",
        choices=("normal", "idle"),
        default="normal",
        help="the control's busy loops' policy (idle: SCHED_IDLE, as ingestion.scheduling)",
    )
    parser.add_argument(
        "--serve-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of both serves, as CONTROLROOM_NAME (e.g. INGESTION__WORKERS=0)",
    )
    parser.add_argument(
        "--keep-drained",
        action="store_true",
        help="leave what the drain stored in the store (default: deleted, then VACUUM)",
    )
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds must be at least 1 and --seconds positive")
    if args.pace < 0:
        parser.error("--pace must not be negative")
    if args.scratch_server and (args.keep or args.reuse or args.database != "postgresql"):
        parser.error("--scratch-server is deleted after the run: no --keep, --reuse or sqlite")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.database == SQLITE_PROVIDER.name:
        with query.scratch_sqlite(args.sqlite_dir, args.reuse, args.keep) as (url, new):
            return run(args, url, new, None, "")
    admin_url = os.environ.get(query.ADMIN_URL_ENV, query.DEFAULT_ADMIN_URL)
    rabbitmq_url = os.environ.get(RABBITMQ_URL_ENV) or DEFAULT_RABBITMQ_URL
    with (
        admin_server(args, admin_url) as admin,
        query.scratch_database(admin, args.reuse, args.keep) as (url, new),
        scratch_vhost(rabbitmq_url) as broker_url,
    ):
        return run(args, url, new, admin, broker_url)


def run(
    args: argparse.Namespace, url: str, new: bool, admin_url: str | None, broker_url: str
) -> int:
    began = time.perf_counter()
    query.prepare_store(url, new, args.messages, args.workers)
    print("\n".join(query.environment(url)))
    engine = create_store_engine(url)
    rows, groups, latest = store_state(engine)
    assert latest is not None, "an empty store"
    ingestion = IngestionSettings()
    settings = ", ".join(args.serve_setting) or (
        f"defaults: ingestion.workers {ingestion.workers}, ingestion.nice {ingestion.nice}"
    )
    print(f"serve: {settings}; {', '.join(query.SERVE_KEEPS_LOADED)}")
    # Autogroup decides whether the priority reaches a local store's backends at all
    # (docs/decisions.md "Autogroup voids the backends' priority").
    print(f"kernel autogroup: {'off or absent' if autogroup_warning() is None else 'on'}")
    database = sa.make_url(url).database or ""
    try:
        measure(args, url, engine, rows, admin_url, database, broker_url, ingestion)
    finally:
        if not args.keep_drained and (args.keep or not new):
            remove_drained(engine, latest)
            after = store_state(engine)
            print(
                f"store: {rows:,} failed messages and {groups:,} group rows before the run, "
                f"{after[0]:,} and {after[1]:,} after"
            )
    engine.dispose()
    print(f"{query.load_average()}; the run took {time.perf_counter() - began:.0f} s")
    return 0


def measure(
    args: argparse.Namespace,
    url: str,
    engine: sa.Engine,
    rows: int,
    admin_url: str | None,
    database: str,
    broker_url: str,
    ingestion: IngestionSettings,
) -> None:
    """Serve A idle and beside the busy loops, the backlog, serve B draining; prints the
    windows as they end, then the tables."""
    port = free_port()
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    warnings = []
    with (
        tempfile.TemporaryDirectory(prefix="controlroom-bench-views-") as scratch,
        httpx.Client(
            base_url=f"http://127.0.0.1:{port}", timeout=query.HTTP_TIMEOUT, limits=limits
        ) as client,
    ):
        data_dir = Path(scratch)
        with served(url, broker_url, data_dir, port, args.serve_setting, "idle") as serve:
            views = choose_views(client, engine, rows, args.views, args.only)
            pacing = f"a call every {args.pace} s" if args.pace else "each call after the last"
            print(f"{len(views)} views, round robin through one keep-alive connection, {pacing}")

            def warm_up() -> None:
                for _ in range(args.warm_up):
                    read_round_robin(views, 0, {v.name: [] for v in views})

            def windows(probe: Probe, order: Sequence[tuple[int, str]]) -> list[Window]:
                return run_windows(
                    probe,
                    views,
                    order,
                    args.seconds,
                    args.control_nice,
                    args.control_scheduling,
                    args.pace,
                )

            warm_up()
            details = {view.name: str(view.run()) for view in views}
            probe = Probe(serve.process.pid, metrics_url, admin_url, database)
            print(f"\nserve A, empty queue: idle and beside {os.cpu_count()} busy loops")
            try:
                quiet = windows(probe, window_order(args.rounds, IDLE, CONTROL))
            finally:
                probe.close()
        warnings += [f"serve A: {line}" for line in log_warnings(serve.log_path)]
        publish_backlog(broker_url, data_dir, args.backlog)
        print(f"\nserve B, draining the backlog ({query.load_average()})")
        with served(url, broker_url, data_dir, port, args.serve_setting, "drain") as serve:
            probe = Probe(serve.process.pid, metrics_url, admin_url, database)
            try:
                deadline = time.monotonic() + DRAIN_START_SECONDS
                while probe.settled() == 0:
                    if time.monotonic() > deadline:
                        log = serve.log_path.read_text(errors="replace")
                        raise RuntimeError(f"serve B settled nothing: {log[-2000:]}")
                    time.sleep(0.2)
                warm_up()
                draining = windows(probe, window_order(args.rounds, WITHOUT, WITH))
            finally:
                probe.close()
        left = asyncio.run(queued(broker_url)) if broker_url else None
        warnings += [f"serve B: {line}" for line in log_warnings(serve.log_path)]
        purged = asyncio.run(purge_backlog(broker_url, data_dir))
        print(f"\nserve C, the backlog's rest purged ({purged:,} messages): idle again")
        with served(url, broker_url, data_dir, port, args.serve_setting, "after") as serve:
            warm_up()
            probe = Probe(serve.process.pid, metrics_url, admin_url, database)
            try:
                after = windows(probe, [(number, AFTER) for number in range(1, args.rounds + 1)])
            finally:
                probe.close()
        warnings += [f"serve C: {line}" for line in log_warnings(serve.log_path)]
    report(views, details, quiet, draining, after)
    print_drain(args, ingestion, draining, draining[-1].end.settled, left)
    for line in warnings:
        print(line)


# --- the report ------------------------------------------------------------------------------
def pooled(windows: Sequence[Window], kind: str, name: str) -> list[float]:
    return [ms for w in windows if w.kind == kind for ms in w.samples[name]]


def report(
    views: Sequence[query.Scenario],
    details: dict[str, str],
    quiet: Sequence[Window],
    draining: Sequence[Window],
    after: Sequence[Window],
) -> None:
    """A Markdown table: per view idle p50 and p95, draining p95 and its ratio to idle,
    the control's p95 and its ratio, idle after the drain (the same answers as while
    draining, or larger) and draining's ratio to it, and the samples of each kind."""
    print(
        "\n| view | idle p50 | idle p95 | draining p50 | draining p95 | draining / idle p95 | "
        "control p95 | control / idle p95 | idle after p50 | idle after p95 | "
        "draining / idle after p95 | samples idle / draining / control / after | "
        "answer (idle) |"
    )
    print("| --- |" + " ---: |" * 11 + " --- |")
    within = within_after = 0
    thin = []
    for view in views:
        idle = pooled(quiet, IDLE, view.name)
        drain = pooled(draining, WITH, view.name)
        control = pooled(quiet, CONTROL, view.name)
        later = pooled(after, AFTER, view.name)
        base = p95(idle)
        ratio, ratio_after = p95(drain) / base, p95(drain) / p95(later)
        within += ratio <= TARGET_P95_RATIO
        within_after += ratio_after <= TARGET_P95_RATIO
        if min(len(idle), len(drain), len(control), len(later)) < MIN_SAMPLES:
            thin.append(view.name)
        print(
            f"| {view.name} | {statistics.median(idle):.1f} | {base:.1f} | "
            f"{statistics.median(drain):.1f} | {p95(drain):.1f} | "
            f"{ratio:.2f} | {p95(control):.1f} | {p95(control) / base:.2f} | "
            f"{statistics.median(later):.1f} | {p95(later):.1f} | {ratio_after:.2f} | "
            f"{len(idle)} / {len(drain)} / {len(control)} / {len(later)} | "
            f"{details[view.name]} |"
        )
    print(
        f"\nviews whose p95 while draining is within {TARGET_P95_RATIO} x idle: {within} of "
        f"{len(views)} (target: all); within {TARGET_P95_RATIO} x idle after the drain: "
        f"{within_after} of {len(views)}"
    )
    if thin:
        print(
            f"fewer than {MIN_SAMPLES} samples of a kind (a p95 near the maximum; longer "
            f"--seconds or more --rounds): {len(thin)} views"
        )


def print_drain(
    args: argparse.Namespace,
    ingestion: IngestionSettings,
    draining: Sequence[Window],
    settled_at_end: int,
    left: int | None,
) -> None:
    def rate(kind: str) -> float:
        chosen = [w for w in draining if w.kind == kind]
        return sum(w.settled for w in chosen) / sum(w.seconds for w in chosen)

    without, with_reader = rate(WITHOUT), rate(WITH)
    per_round = []
    for number in sorted({w.round for w in draining}):
        pair = {w.kind: w for w in draining if w.round == number}
        # A window after the backlog ran out settled nothing: no ratio (said below).
        if pair[WITHOUT].rate:
            per_round.append(pair[WITH].rate / pair[WITHOUT].rate)
    ratio = f"{with_reader / without:.2f}" if without else "none (nothing settled)"
    print(
        f"drain rate without a reader {without:,.0f} messages/s, with the reader "
        f"{with_reader:,.0f}: with / without {ratio} (target >= "
        f"{TARGET_DRAIN_RATIO}); per round {', '.join(f'{r:.2f}' for r in per_round)}"
    )
    remaining = args.backlog - settled_at_end
    queue = f"; {left:,} ready in the queue after serve stopped" if left is not None else ""
    if remaining < ingestion.effective_prefetch:
        print(
            f"THE BACKLOG RAN OUT: {settled_at_end:,} of {args.backlog:,} settled by the end "
            "of the last window; the later windows were not at full speed (a larger "
            f"--backlog){queue}"
        )
    else:
        print(
            f"backlog: {settled_at_end:,} of {args.backlog:,} settled by the end of the last "
            f"window, {remaining:,} left: the drain lasted through every window{queue}"
        )


if __name__ == "__main__":
    sys.exit(main())
