"""Intake in worker processes at a lower CPU priority (docs/design.md "Process shape").

``controlroom serve`` with ``ingestion.workers`` > 0 starts that many worker processes
(multiprocessing, spawn context) and keeps health, metrics, the API and the console in
its own. Each worker lowers its CPU priority by ``ingestion.nice`` (``os.nice``), opens
the store and the transport, and runs the error queue's and the telemetry queue's
intakes, the retry processor (its sends) and the notification dispatcher, its garbage
collector tuned for a drain (``runtime.collector``). The priority
covers the database work a worker starts: SQLite runs in the worker itself; a PostgreSQL
backend serving a worker's connection is reniced too, when the store says where its
backend runs and this process may renice it (``db.providers``: ``local_backend_pid``).

One pipe per worker carries, worker to serve: its intakes' health reports (``stored``,
``failed``, ``depth``: serve's ``IntakeHealth`` applies them, so ``/api/health`` answers
as in one process, and serve writes their changes to the event log,
``events.report_intakes``), telemetry written (the KPI sampler's cue) and a snapshot of its
metrics (the Prometheus text format, every ``METRICS_SECONDS`` and at its end), which
serve's ``/metrics`` merges with its own, each worker's series labelled ``worker``.
Serve to worker: ``wake`` (a retry was requested: look for batches now).

A worker that ends while serve runs is logged and started again, after a back-off that
doubles from ``RESTART_MIN_SECONDS`` to ``RESTART_MAX_SECONDS`` and starts again from the
minimum once a worker has run ``RESTART_RESET_SECONDS``; the messages it held in the
embedded queue go back to the queue at once (RabbitMQ redelivers them by itself). Its
intakes' health is degraded from its end until the worker started in its place has run
``RESTART_RESET_SECONDS`` (``IntakeHealth.worker_ended``).
``stop()`` sends SIGTERM to every worker: a worker stops taking deliveries, finishes the
batches it holds (committed, then acknowledged: ``transport.batching``), lets its other
parts end, and exits; what no batch held goes back to its queue unwritten when the
transport closes. One that has not exited ``STOP_MARGIN_SECONDS`` after its batches' grace
(``ingestion.stop_grace_seconds``) is killed. A worker whose serve ended (a second signal,
a kill) is killed by the kernel (``_end_with_serve``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.providers import provider_for
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.errors.retries.processor import RetryProcessor
from controlroom.notifications.dispatcher import Dispatcher
from controlroom.notifications.rules import rules_applied
from controlroom.runtime.collector import collect_as_intake
from controlroom.runtime.demo_logs import quiet_demo_logs
from controlroom.runtime.intake_health import IntakeHealth, IntakeState
from controlroom.runtime.reads_first import ReadsInFlight, YieldToReads
from controlroom.sitecalls.intake import TelemetryIngestionService
from controlroom.transport import create_transport
from controlroom.transport.embedded import release_claims

log = logging.getLogger(__name__)

METRICS_SECONDS = 1.0
RESTART_MIN_SECONDS = 0.5
RESTART_MAX_SECONDS = 30.0
RESTART_RESET_SECONDS = 60.0
STOP_MARGIN_SECONDS = 30.0
"""Past the grace, the longest one write may still wait (SQLite's busy timeout)."""

_SERVE_ONLY_METRICS = ("controlroom_intake_",)
"""Families a worker's snapshot leaves out: serve owns its intakes' health gauges."""
_WORKER_ONLY_METRICS = ("controlroom_worker_", "controlroom_ingestion_")
"""Families serve's own exposition leaves out: only workers count them (with workers,
serve writes no batch)."""


# -- the worker process ---------------------------------------------------------------


def worker_main(
    settings: Settings, index: int, conn: Connection, owner: str, reads: ReadsInFlight
) -> None:
    """The worker process's entry point (module docstring): lower the priority, run the
    parts until SIGTERM, then exit. SIGINT is left to serve, which stops its workers.
    ``owner`` names the embedded queue's claims of this worker, so serve can give them
    back when the worker dies; ``reads`` counts the reads serve is answering, which the
    worker's statements wait for (``yield_to_reads``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _end_with_serve()
    os.nice(settings.ingestion.nice)
    # Set before any thread starts: Linux keeps the policy per thread, and new threads
    # inherit it (docs/design.md "Process shape").
    _idle_policy(settings.ingestion.scheduling, 0)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s worker-{index} %(name)s: %(message)s",
    )
    quiet_demo_logs()  # only under controlroom demo run
    if settings.ingestion.cpu_cgroup is not None:
        try:
            _join_cgroup(settings.ingestion.cpu_cgroup, os.getpid())
        except OSError as exc:
            log.warning("the worker stays out of intake's cgroup: %s", exc)
        else:
            log.info("joined intake's cgroup %s", settings.ingestion.cpu_cgroup)
    gate = YieldToReads(reads, share=settings.ingestion.yield_to_reads)
    asyncio.run(_work(settings, _Reporter(conn), owner, gate))


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _end_with_serve() -> None:
    """Have the kernel kill this worker when serve ends (Linux: ``PR_SET_PDEATHSIG``),
    however serve ends: a second signal or a kill ends serve at once, and its worker must
    not go on alone, holding batches beside a serve started again on the same data
    directory. What the worker held goes back to its queue (RabbitMQ redelivers; the
    embedded queue as soon as a transport opens it, the next serve's or worker's, or when
    the claims' lease runs out). Elsewhere a no-op."""
    if sys.platform != "linux":
        return
    serve = multiprocessing.parent_process()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        log.warning("cannot ask to end with serve: %s", os.strerror(ctypes.get_errno()))
    elif serve is not None and os.getppid() != serve.pid:
        os._exit(1)  # serve ended before the request took effect


class _Reporter:
    """The worker's end of its pipe; thread-safe (writers report from their threads)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, *message: Any) -> None:
        with self._lock, contextlib.suppress(OSError):  # serve is gone: nothing to tell
            self.conn.send(message)

    def send_metrics(self) -> None:
        self.send("metrics", generate_latest(REGISTRY).decode())


class _ReportingHealth(IntakeHealth):
    """An intake's health in a worker: every report goes to serve, whose ``IntakeHealth``
    of the same name decides and answers."""

    def __init__(self, of: IntakeHealth, reporter: _Reporter) -> None:
        super().__init__(of.name, of.queue, stall_seconds=1.0)
        self._reporter = reporter

    def stored(self) -> None:
        self._reporter.send("health", self.name, "stored", None)

    def failed(self, reason: str) -> None:
        self._reporter.send("health", self.name, "failed", reason)

    def observed_depth(self, messages: int) -> None:
        self._reporter.send("health", self.name, "depth", messages)

    def transition(self) -> IntakeState | None:
        """Never a change here: serve writes its intakes' changes to the event log
        (``events.report_intakes``), from the reports it applies."""
        return None


async def _work(settings: Settings, reporter: _Reporter, owner: str, gate: YieldToReads) -> None:
    stop = asyncio.Event()

    def on_sigterm() -> None:
        gate.stop_waiting()
        stop.set()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    engine = create_store_engine(settings.effective_database_url)
    yield_to_reads(engine, gate)
    _lower_backends(
        engine,
        settings.ingestion.nice,
        settings.ingestion.scheduling,
        settings.ingestion.cpu_cgroup,
    )
    transport = create_transport(settings, owner=owner)
    await transport.start()
    collect_as_intake()
    try:
        with rules_applied(engine, settings.notifications):
            await _run_parts(settings, engine, transport, reporter, stop)
    finally:
        await transport.close()
        engine.dispose()
        reporter.send_metrics()


async def _run_parts(
    settings: Settings, engine: sa.Engine, transport: Any, reporter: _Reporter, stop: asyncio.Event
) -> None:
    body_store = FileSystemBodyStore(settings.body_dir)
    errors = IngestionService(settings, engine, transport, body_store)
    telemetry = TelemetryIngestionService(
        settings, engine, transport, on_written=lambda: reporter.send("telemetry written")
    )
    for intake in (errors, telemetry):
        intake.health = _ReportingHealth(intake.health, reporter)
    retries = RetryProcessor(settings, engine, transport, body_store)
    dispatcher = Dispatcher(settings, engine, owner=str(uuid.uuid4()))
    loop = asyncio.get_running_loop()
    loop.add_reader(reporter.conn.fileno(), partial(_on_serve_message, reporter.conn, retries))
    intakes = [asyncio.create_task(errors.run()), asyncio.create_task(telemetry.run())]
    others = [
        asyncio.create_task(retries.run()),
        asyncio.create_task(dispatcher.run()),
        asyncio.create_task(_report_metrics(reporter)),
    ]
    ended = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([ended, *intakes, *others], return_when=asyncio.FIRST_COMPLETED)
    loop.remove_reader(reporter.conn.fileno())
    # Both at once: each takes no more deliveries from now, and their graces run together.
    await asyncio.gather(errors.stop(), telemetry.stop())
    for task in [ended, *others]:
        task.cancel()
    await asyncio.gather(*intakes, *others, return_exceptions=True)
    if ended not in done:  # a part ended while the worker should run: serve restarts it
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("a part of the worker stopped", exc_info=task.exception())
        raise SystemExit(1)


def _on_serve_message(conn: Connection, retries: RetryProcessor) -> None:
    try:
        message = conn.recv()
    except (EOFError, OSError):
        os.kill(os.getpid(), signal.SIGTERM)  # serve is gone: stop as if told to
        return
    if message == ("wake",):
        retries.wake()


async def _report_metrics(reporter: _Reporter) -> None:
    while True:
        reporter.send_metrics()
        await asyncio.sleep(METRICS_SECONDS)


AUTOGROUP_SYSCTL = Path("/proc/sys/kernel/sched_autogroup_enabled")
"""Linux's switch of autogroup (sched(7), "The autogroup feature")."""


def _idle_policy(scheduling: str, pid: int) -> None:
    """Put ``pid`` (0: the calling thread) under SCHED_IDLE when ``scheduling`` is
    ``"idle"``; raises ``OSError`` when the OS refuses. A policy this platform lacks
    leaves the nice value alone to lower the priority."""
    if scheduling == "idle" and hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))


def autogroup_warning(sysctl: Path | None = None) -> str | None:
    """What Linux's autogroup does to the workers' priority, when ``sysctl`` (default
    ``AUTOGROUP_SYSCTL``) says it is on; ``None`` when it is off or absent (another
    kernel or platform). With autogroup every session is one scheduling group, the groups
    share the CPU as equals, and a nice or ``SCHED_IDLE`` ranks a process only within its
    group: a local store's backends live in its server's session, so those a worker
    lowered compete with serve's reads as equals (docs/decisions.md "Autogroup voids the
    backends' priority")."""
    sysctl = sysctl or AUTOGROUP_SYSCTL
    try:
        value = sysctl.read_text().strip()
    except OSError:
        return None
    if value in ("", "0"):
        return None
    return (
        f"the kernel's autogroup is on ({sysctl} = {value}): a nice or SCHED_IDLE ranks a process "
        "only within its session, so the store's backends that a worker lowered still compete with "
        "the console's reads as equals; for reads to keep priority turn it off (sysctl "
        "kernel.sched_autogroup_enabled=0) or give intake a cgroup (ingestion.cpu_cgroup, "
        "or ingestion.own_cgroup where serve runs as root or in a delegated cgroup) "
        "(docs/decisions.md \"Autogroup voids the backends' priority\")"
    )


def yield_to_reads(engine: sa.Engine, gate: YieldToReads) -> None:
    """Before each statement ``engine`` sends from a thread of its own, wait for serve's
    reads (``gate``, docs/decisions.md "Reads first: the workers wait for serve's reads").
    A statement on the event loop's thread does not wait: it would hold up the worker's
    deliveries and its stop."""

    def wait(*_: Any) -> None:
        if gate.idle:  # the common case, before the dearer question of the thread
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            gate.wait()

    sa.event.listen(engine, "before_cursor_execute", wait)


_CPU_CONTROLS = ("cpu.weight", "cpu.shares", "cpu.idle")
"""A cgroup's files of the CPU controller that set its weight (v2, v1, v2's idle)."""


def cgroup_problem(directory: Path) -> str | None:
    """Why the workers could not join ``directory`` as ``ingestion.cpu_cgroup``, naming it;
    ``None`` when they can. Serve checks it at start rather than each worker warning: a
    path that does not exist or is no cgroup (its ``cgroup.procs`` lists the processes in
    it), one of no CPU weight (another controller's, or v2's without ``cpu`` in its
    parent's ``cgroup.subtree_control``), a hierarchy's root (every process is in it),
    or one this user may not move processes into."""
    procs = directory / "cgroup.procs"
    if not directory.exists():
        return f"{directory} does not exist: make it under the cpu controller's hierarchy"
    if not procs.is_file():
        return f"{directory} is no cgroup directory (one holding cgroup.procs)"
    if not any((directory / control).is_file() for control in _CPU_CONTROLS):
        return (
            f"{directory} sets no CPU weight (no cpu.weight, cpu.shares or cpu.idle): make "
            "it under the cpu controller's hierarchy (v2: with cpu in its parent's "
            "cgroup.subtree_control)"
        )
    if os.path.ismount(directory):
        return f"{directory} is a hierarchy's root, where every process is: make a cgroup under it"
    if not os.access(procs, os.W_OK):
        return (
            f"this user may not move processes into {directory} (its cgroup.procs is not "
            "writable)"
        )
    return None


def _join_cgroup(cgroup: Path, pid: int) -> None:
    """Move process ``pid`` into the cgroup directory ``cgroup`` (``ingestion.cpu_cgroup``:
    docs/decisions.md "Intake's own cgroup escapes autogroup"). Raises ``OSError`` when
    the kernel refuses."""
    (cgroup / "cgroup.procs").write_text(f"{pid}\n")


def _lower_backends(
    engine: sa.Engine, nice: int, scheduling: str, cgroup: Path | None = None
) -> None:
    """Renice each PostgreSQL backend serving this worker's connections by ``nice`` (and
    put it under the worker's scheduling policy, and into ``cgroup`` when given), when the
    store says it runs on this machine and the OS lets this process (docs/design.md
    "Process shape"); otherwise the backend keeps its priority, said once in the log, and
    a backend the kernel keeps out of ``cgroup`` keeps the nice, also said once. The
    first backend lowered logs ``autogroup_warning`` as a warning when there is one and
    no cgroup took the backends out of the autogroup."""
    provider = provider_for(engine)
    told: set[str] = set()
    lowered = threading.Event()

    def tell_once(what: str, message: str, *args: object) -> None:
        if what not in told:
            told.add(what)
            log.info(message, *args)

    def lower(dbapi_connection: Any, _record: Any) -> None:
        pid = provider.local_backend_pid(dbapi_connection)
        if pid is None:
            return
        try:
            current = os.getpriority(os.PRIO_PROCESS, pid)
            os.setpriority(os.PRIO_PROCESS, pid, min(19, current + nice))
            _idle_policy(scheduling, pid)
        except OSError as exc:
            tell_once("nice", "the store's backends keep their priority: %s", exc)
            return
        joined = cgroup is not None
        if cgroup is not None:
            try:
                _join_cgroup(cgroup, pid)
            except OSError as exc:
                joined = False
                tell_once(
                    "cgroup",
                    "the store's backends could not join intake's cgroup %s: %s; they keep "
                    "the nice alone",
                    cgroup,
                    exc,
                )
        if not lowered.is_set():
            lowered.set()
            if not joined and (warning := autogroup_warning()) is not None:
                log.warning(warning)

    sa.event.listen(engine, "connect", lower)


# -- serve's side ---------------------------------------------------------------------


@dataclass
class _Worker:
    index: int
    process: BaseProcess
    conn: Connection
    started: float
    owner: str
    metrics: str = ""
    exited: asyncio.Event = field(default_factory=asyncio.Event)


class WorkerPool:
    """Serve's worker processes (module docstring). ``healths``: serve's ``IntakeHealth``
    by intake name, which the workers' reports update; ``on_telemetry_written``: called
    when a worker wrote telemetry."""

    def __init__(
        self,
        settings: Settings,
        healths: Iterable[IntakeHealth],
        *,
        on_telemetry_written: Callable[[], None],
    ) -> None:
        self._settings = settings
        self._healths: Mapping[str, IntakeHealth] = {h.name: h for h in healths}
        self._on_telemetry_written = on_telemetry_written
        self._context = multiprocessing.get_context("spawn")
        self.reads = ReadsInFlight.shared(self._context)
        """The reads serve is answering, which the workers' statements wait for: serve
        counts them with ``CountReads``."""
        self._workers: dict[int, _Worker] = {}
        self._stopping = False
        self._last_metrics: dict[int, str] = {}

    @property
    def pids(self) -> list[int]:
        """The process ids of the running workers."""
        return [w.process.pid for w in self._workers.values() if w.process.pid is not None]

    async def run(self) -> None:
        """Start the workers and keep them running until ``stop()``; cancelled (another
        part of serve failed), it stops them before it ends, so no worker outlives it."""
        try:
            await asyncio.gather(
                *(self._keep(index) for index in range(self._settings.ingestion.workers))
            )
        finally:
            await self.stop()

    async def _keep(self, index: int) -> None:
        delay = RESTART_MIN_SECONDS
        while not self._stopping:
            worker = self._start(index)
            await self._watch(worker)
            if self._stopping:
                return
            ran = time.monotonic() - worker.started
            delay = RESTART_MIN_SECONDS if ran >= RESTART_RESET_SECONDS else delay
            log.error(
                "intake worker %d (pid %s) ended with exit code %s; starting it again in %.1f s",
                index,
                worker.process.pid,
                worker.process.exitcode,
                delay,
            )
            for health in self._healths.values():
                health.worker_ended(
                    index, f"intake worker {index} ended (exit code {worker.process.exitcode})"
                )
            await self._give_back_claims(worker)
            await asyncio.sleep(delay)
            delay = min(RESTART_MAX_SECONDS, delay * 2)

    async def _watch(self, worker: _Worker) -> None:
        """Wait for ``worker`` to end; once it has run ``RESTART_RESET_SECONDS`` it counts
        as running (the end of a predecessor no longer degrades the intakes)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(RESTART_RESET_SECONDS):
                await worker.exited.wait()
        if worker.exited.is_set():
            return
        for health in self._healths.values():
            health.worker_running(worker.index)
        await worker.exited.wait()

    async def _give_back_claims(self, worker: _Worker) -> None:
        """The dead worker's embedded-queue claims back to the queue now, not at lease
        expiry (RabbitMQ does it by itself when the connection drops)."""
        if self._settings.broker_url:
            return
        path = self._settings.embedded_queue_path
        try:
            released = await asyncio.to_thread(release_claims, path, worker.owner)
        except sqlite3.Error:
            log.warning(
                "could not give back intake worker %d's claims", worker.index, exc_info=True
            )
            return
        if released:
            log.info("gave back %d messages intake worker %d held", released, worker.index)

    def _start(self, index: int) -> _Worker:
        ours, theirs = self._context.Pipe(duplex=True)
        owner = f"worker-{index}-{uuid.uuid4()}"
        process = self._context.Process(
            target=worker_main,
            args=(self._settings, index, theirs, owner, self.reads),
            name=f"controlroom-worker-{index}",
            daemon=False,
        )
        process.start()
        theirs.close()
        worker = _Worker(index, process, ours, time.monotonic(), owner)
        self._workers[index] = worker
        loop = asyncio.get_running_loop()
        loop.add_reader(ours.fileno(), partial(self._on_message, worker))
        loop.add_reader(process.sentinel, partial(self._on_exit, worker))
        log.info("intake worker %d started (pid %s)", index, process.pid)
        return worker

    def _on_message(self, worker: _Worker) -> bool:
        """Take one message from ``worker``; ``False`` once its end of the pipe closed."""
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(worker.conn.fileno())
            return False
        kind = message[0]
        if kind == "metrics":
            self._last_metrics[worker.index] = message[1]
        elif kind == "health":
            self._apply_health(*message[1:])
        elif kind == "telemetry written":
            self._on_telemetry_written()
        return True

    def _apply_health(self, name: str, what: str, argument: Any) -> None:
        health = self._healths.get(name)
        if health is None:
            return
        if what == "stored":
            health.stored()
        elif what == "failed":
            health.failed(str(argument))
        elif what == "depth":
            health.observed_depth(int(argument))

    def _on_exit(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(worker.process.sentinel)
        while worker.conn.poll() and self._on_message(worker):
            pass  # what it said last (its final metrics)
        loop.remove_reader(worker.conn.fileno())
        worker.conn.close()
        worker.process.join()
        worker.exited.set()

    def wake(self) -> None:
        """Tell every worker's retry processor to look for batches now."""
        for worker in self._workers.values():
            if not worker.exited.is_set():
                with contextlib.suppress(OSError):
                    worker.conn.send(("wake",))

    async def stop(self) -> None:
        """SIGTERM every worker and wait for it (killed ``STOP_MARGIN_SECONDS`` after the
        batches' grace, ``ingestion.stop_grace_seconds``)."""
        self._stopping = True
        workers = list(self._workers.values())
        for worker in workers:
            if not worker.exited.is_set():
                worker.process.terminate()
        grace = self._settings.ingestion.stop_grace_seconds
        deadline = asyncio.get_running_loop().time() + grace + STOP_MARGIN_SECONDS
        for worker in workers:
            try:
                async with asyncio.timeout_at(deadline):
                    await worker.exited.wait()
            except TimeoutError:
                log.error(
                    "intake worker %d did not stop; killing it: the deliveries it holds go "
                    "back to the queue, to be delivered again",
                    worker.index,
                )
                worker.process.kill()
                await worker.exited.wait()
                await self._give_back_claims(worker)

    def exposition(self) -> bytes:
        """Serve's own metrics merged with the workers' last snapshots (module
        docstring), in the Prometheus text format."""
        return merged_exposition(generate_latest(REGISTRY).decode(), self._last_metrics)


def merged_exposition(own: str, workers: Mapping[int, str]) -> bytes:
    """``own`` (a Prometheus text exposition) with every family of each worker's (by
    index) merged in, their samples labelled ``worker="<index>"``; the families of
    ``_SERVE_ONLY_METRICS`` are taken from ``own`` only, those of
    ``_WORKER_ONLY_METRICS`` from the workers only."""
    families: dict[str, Metric] = {}
    for family in text_string_to_metric_families(own):
        if not family.name.startswith(_WORKER_ONLY_METRICS):
            families[family.name] = family
    for index, text in sorted(workers.items()):
        for family in text_string_to_metric_families(text):
            if family.name.startswith(_SERVE_ONLY_METRICS):
                continue
            into = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type)
            )
            into.samples.extend(
                Sample(s.name, {**s.labels, "worker": str(index)}, s.value, s.timestamp)
                for s in family.samples
            )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


class _Families:
    """A collector of fixed families (for ``merged_exposition``)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families
