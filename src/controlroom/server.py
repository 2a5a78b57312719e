"""The composition root of central's service: ``run`` builds the process and runs it.

``controlroom serve`` calls it; so can an embedder or a test, without typer or a
subprocess. It waits for the store and the broker while they are unreachable
(``runtime.startup``, up to ``startup.wait_seconds``), opens the store (migrating it, and
writing the search terms of rows stored before migration 0009), starts the transport,
builds the API (``create_app``) behind the Host check, and runs its parts in one
``asyncio.TaskGroup``:

- ``http``: uvicorn serving the API and the console on the listening socket;
- ``ingestion`` and ``telemetry ingestion`` (when ``ingest_on_serve``), the retry
  processor and the notification dispatcher: in ``ingestion.workers`` worker processes
  at a lower CPU priority (``workers``, supervised by the ``workers`` part; docs/design.md
  "Process shape"), or in this process when ``ingestion.workers`` is 0 (an intake whose
  consumer the broker cancelled consumes again, as a worker would be started again);
- the retry processor and the periodic singletons (``runtime.periodic``: retention
  sweep, KPI sampler, site-call purge, and reconciliation when sites are configured),
  each under its lease, so one process does each when several serve one database;
- the notification dispatcher (``notifications.dispatcher``): every process claims due
  notifications where the store lets several claim at once, else one under its lease;
  the notification purge (``notifications.retention``) and KPI sampler
  (``notifications.history``), each under its lease. The notification rules act on each
  event recorded on the store (``notifications.rules.rules_applied``), in its transaction;
  with worker processes, serve writes their intakes' changes of health to the event log
  (``events.report_intakes``).

Every part runs until the service stops. When ``stop`` is set the service stops in order:
ingestion first (nothing is taken from a queue after the signal), then the HTTP server
finishes its requests and the other parts are cancelled (each periodic part waits for
the work it is running before it releases its lease). A part that raises, or returns
while it should run, is logged (``"<part> stopped"``, with its traceback, or ``"<part>
stopped on its own"``), the others are cancelled, and ``run`` raises ``PartStopped``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import sqlalchemy as sa
import uvicorn

from controlroom.api import database_check
from controlroom.api.guard import HostGuard
from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.engine import create_store_engine, shown_url, store_identity
from controlroom.db.errors import describe_store_error, is_transient
from controlroom.db.migrate import require_writable, upgrade_database
from controlroom.db.providers import provider_for
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import INTAKE_NAME as ERROR_INTAKE
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.errors.ingest.search_backfill import write_missing_search_terms
from controlroom.errors.retention import RetentionSweeper
from controlroom.errors.retries.processor import RetryProcessor
from controlroom.events import report_intakes, resume_intake_reports
from controlroom.exceptions import ControlroomError
from controlroom.notifications.dispatcher import Dispatcher
from controlroom.notifications.history import NotificationKpiSampler
from controlroom.notifications.retention import NotificationRetention
from controlroom.notifications.rules import rules_applied
from controlroom.runtime import intake_cgroup
from controlroom.runtime.addresses import url_host
from controlroom.runtime.intake_cgroup import IntakeCgroup, made_intake_cgroup
from controlroom.runtime.intake_health import IntakeHealth
from controlroom.runtime.reads_first import CountReads, WeighIntake
from controlroom.runtime.serve_lock import serving
from controlroom.runtime.sockets import listen
from controlroom.runtime.startup import Stopped, said_while_slow, wait_until_reachable
from controlroom.sitecalls.history import KpiSampler
from controlroom.sitecalls.intake import INTAKE_NAME as TELEMETRY_INTAKE
from controlroom.sitecalls.intake import TelemetryIngestionService
from controlroom.sitecalls.reconciliation import ReconciliationService
from controlroom.sitecalls.retention import SiteCallRetention
from controlroom.transport import Transport, TransportError, create_transport
from controlroom.workers import (
    RESTART_MAX_SECONDS,
    RESTART_MIN_SECONDS,
    RESTART_RESET_SECONDS,
    WorkerPool,
)

log = logging.getLogger(__name__)

HTTP_STOP_SECONDS = 10
"""At the stop, how long answers under way may take to finish before their connections are
cut: a client that reads none of its answers would hold the stop for as long as it
stays."""


class PartStopped(ControlroomError):
    """A part of the service (``part``: its name) ended while the service should run; its
    exception, when it raised one, is the ``__cause__``."""

    def __init__(self, part: str) -> None:
        super().__init__(f"{part} stopped")
        self.part = part


@dataclass(frozen=True, slots=True)
class Serving:
    """What ``run`` tells ``on_serving`` once every part has started: the base URL of the
    bound socket (``http://host:port``) and whether it ingests the queues."""

    url: str
    ingesting: bool


async def run(
    settings: Settings,
    *,
    listener: socket.socket | None = None,
    stop: asyncio.Event | None = None,
    on_serving: Callable[[Serving], None] | None = None,
) -> None:
    """Run the service until ``stop`` is set (without one, until cancelled).

    ``listener``: a listening socket to serve on (it stays the caller's to close), made by
    ``runtime.sockets.listen`` so accepted connections get ``TCP_NODELAY``; by default
    one is bound to ``settings.host:settings.port`` that way. ``on_serving`` is called
    once, when every part has started (the socket already accepts connections).
    Before it opens the store and the transport it waits for them while they are
    unreachable (``runtime.startup``), until ``settings.startup.wait_seconds`` after the
    call; ``stop`` set meanwhile makes it return. Raises ``ConfigurationError`` when the
    address cannot be bound, ``DependencyUnreachable`` when the wait ends, the store's and
    transport's other errors when they cannot be opened, and ``PartStopped`` when a part
    ended on its own (the module docstring).
    """
    own_listener = listener is None
    listener = (
        listener
        if listener is not None
        else listen(settings.host, settings.port, chosen_by="--port or CONTROLROOM_PORT")
    )
    stop = stop if stop is not None else asyncio.Event()
    # One startup.wait_seconds for the store and the broker together, as its errors say.
    began = asyncio.get_running_loop().time()
    deadline = began + settings.startup.wait_seconds
    try:
        engine = create_store_engine(settings.effective_database_url)
        try:
            await wait_until_reachable(
                f"the database {shown_url(engine.url)}",
                lambda: asyncio.to_thread(_probe_store, engine),
                unreachable=is_transient,
                describe=describe_store_error,
                deadline=deadline,
                stop=stop,
                began=began,
            )
            with said_while_slow("its migrations"):
                upgrade_database(engine)
            with said_while_slow("a test write"):
                require_writable(engine)
            with said_while_slow("the search terms of messages stored before migration 0009"):
                write_missing_search_terms(engine, progress=_log_search_terms_progress)
            _warn_of_audit_log_exposure(engine)
            _warn_of_vacuum_settings(engine)
            _warn_of_server_settings(engine)
            transport = create_transport(settings)
            try:
                await wait_until_reachable(
                    "the broker",
                    transport.start,
                    unreachable=lambda exc: isinstance(exc, TransportError),
                    describe=str,
                    deadline=deadline,
                    stop=stop,
                    began=began,
                )
                with (
                    _intake_cgroup(settings) as (settings, cgroup),
                    rules_applied(engine, settings.notifications),
                    serving(  # make demo refuses to publish meanwhile
                        settings.data_dir,
                        store=store_identity(engine),
                        broker=transport.destination,
                        shown=shown_url(engine.url),
                    ),
                ):
                    service = _Service(
                        settings,
                        engine,
                        transport,
                        listener,
                        on_reading=(
                            WeighIntake(
                                cgroup.reading, share=settings.ingestion.yield_to_reads
                            ).reading
                            if cgroup is not None
                            else None
                        ),
                    )
                    await service.run(stop, on_serving)
            finally:
                await transport.close()
        finally:
            engine.dispose()
    except Stopped:
        log.info("stopped while waiting for the database or the broker")
    finally:
        if own_listener:
            listener.close()


@contextlib.contextmanager
def _intake_cgroup(settings: Settings) -> Iterator[tuple[Settings, IntakeCgroup | None]]:
    """``settings`` with intake's cgroup serve made (``runtime.intake_cgroup``) as the
    workers' ``ingestion.cpu_cgroup``, and that cgroup, removed on exit; ``settings`` as
    they are and ``None`` when the workers have one already, when there are none, or when
    ``ingestion.own_cgroup`` is off."""
    ingestion = settings.ingestion
    if not (
        settings.ingest_on_serve
        and ingestion.workers > 0
        and ingestion.cpu_cgroup is None
        and ingestion.own_cgroup
    ):
        yield settings, None
        return
    records = settings.data_dir / intake_cgroup.RECORDS
    with made_intake_cgroup(ingestion.yield_to_reads, records) as cgroup:
        if cgroup is None:
            yield settings, None
            return
        yield (
            settings.model_copy(
                update={"ingestion": ingestion.model_copy(update={"cpu_cgroup": cgroup.path})}
            ),
            cgroup,
        )


def _probe_store(engine: sa.Engine) -> None:
    """Open a connection and run one statement; the driver's error when the store cannot
    be reached."""
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")


def _warn_of_audit_log_exposure(engine: sa.Engine) -> None:
    """Log a warning when the store's user could rewrite the audit log (docs/design.md
    "Audit log": its guarantees need the service role that ``controlroom migrate`` makes)."""
    with engine.connect() as conn:
        exposure = provider_for(engine).audit_log_exposure(conn)
    if exposure is not None:
        log.warning("audit log: %s", exposure)


def _warn_of_vacuum_settings(engine: sa.Engine) -> None:
    """Log a warning per vacuum setting of the store that lets its counter tables fill
    with dead rows (docs/decisions.md "The counter tables are vacuumed as they turn
    over")."""
    with engine.connect() as conn:
        warnings = provider_for(engine).vacuum_warnings(conn)
    for warning in warnings:
        log.warning("store: %s", warning)


def _warn_of_server_settings(engine: sa.Engine) -> None:
    """Log a warning per memory or WAL setting of the store's server that makes the write
    path's cost grow with the store (docs/decisions.md "The write path's cost does not
    grow with the store")."""
    with engine.connect() as conn:
        warnings = provider_for(engine).server_settings_warnings(conn)
    for warning in warnings:
        log.warning("store: %s", warning)


def _log_search_terms_progress(done: int, total: int) -> None:
    log.info("search terms written for %d of %d stored failed messages", done, total)


def _quiet_routine_telemetry(record: logging.LogRecord) -> bool:
    """Keep an access-log line unless it is an accepted telemetry post: sites post every
    few seconds, and those lines drowned what the service did (``/metrics`` counts them).
    uvicorn's access record args: (client, method, path, HTTP version, status)."""
    args = record.args
    if isinstance(args, tuple) and len(args) == 5:
        _client, method, path, _version, status = args
        routine = method == "POST" and str(path).startswith("/api/site-calls/telemetry")
        return not (routine and isinstance(status, int) and status < 400)
    return True


def _answers_cut_at_the_stop(record: logging.LogRecord) -> bool:
    """One warning line instead of uvicorn's traceback for an answer it cancelled once the
    stop's ``HTTP_STOP_SECONDS`` were over (a client that did not read it), and its count
    of them ("Cancel N running task(s)") a warning too: the cut is the stop's doing, not a
    fault of the route, and twenty stuck clients made twenty tracebacks."""
    if record.exc_info is not None and isinstance(record.exc_info[1], asyncio.CancelledError):
        record.msg, record.args = "an answer under way was cut at the stop, after %s s", (
            HTTP_STOP_SECONDS,
        )
        record.exc_info, record.exc_text = None, None
    elif not str(record.msg).startswith("Cancel %s running task(s)"):
        return True
    record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the caller of ``run`` owns SIGINT/SIGTERM,
    so a signal stops ingestion and the server together (uvicorn's handler would re-raise
    the signal once the server is done, before the rest shuts down)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _Service:
    """The parts of one running service over an open store, transport and socket."""

    def __init__(
        self,
        settings: Settings,
        engine: sa.Engine,
        transport: Transport,
        listener: socket.socket,
        *,
        on_reading: Callable[[bool], None] | None = None,
    ) -> None:
        """``on_reading`` hears when serve starts and stops answering reads (``CountReads``)."""
        self._settings = settings
        self._listener = listener
        self._stopping = False
        body_store = FileSystemBodyStore(settings.body_dir)
        retry_processor = RetryProcessor(settings, engine, transport, body_store)
        reconciliation = ReconciliationService(settings, engine, owner=str(uuid.uuid4()))
        sampler = KpiSampler(engine, settings)
        self._intakes: dict[str, IngestionService | TelemetryIngestionService] = {}
        self._workers: WorkerPool | None = None
        healths: list[IntakeHealth] = []
        if settings.ingest_on_serve and settings.ingestion.workers > 0:
            healths = [
                IntakeHealth(name, queue, stall_seconds=settings.ingestion.stall_seconds)
                for name, queue in (
                    (ERROR_INTAKE, settings.error_queue),
                    (TELEMETRY_INTAKE, settings.telemetry_queue),
                )
            ]
            self._workers = WorkerPool(
                settings, healths, on_telemetry_written=sampler.intake_written
            )
        elif settings.ingest_on_serve:
            self._intakes = {
                "ingestion": IngestionService(settings, engine, transport, body_store),
                "telemetry ingestion": TelemetryIngestionService(
                    settings, engine, transport, on_written=sampler.intake_written
                ),
            }
            healths = [intake.health for intake in self._intakes.values()]
        resume_intake_reports(engine, healths)  # a stall an earlier serve left: recovered
        api = create_app(
            settings,
            engine,
            body_store,
            health_checks={"database": database_check(engine), "broker": transport.check},
            transport=transport,
            retry_processor=self._workers or retry_processor,
            reconciliation=reconciliation,
            on_telemetry_written=sampler.intake_written,
            intakes=healths,
            exposition=self._workers.exposition if self._workers else None,
        )
        # The Host check needs the bound address, which only the server knows (api/guard.py):
        # the socket's port, which differs from settings.port when that is 0 or the caller
        # passed its own socket.
        guarded = HostGuard(
            CountReads(api, self._workers.reads, on_reading=on_reading) if self._workers else api,
            bound_host=settings.host,
            port=listener.getsockname()[1],
            allowed_hosts=settings.allowed_hosts,
        )
        self._http = _Server(
            uvicorn.Config(
                guarded,
                lifespan="off",
                log_level="info",
                # Not uvicorn's own handlers: its lines go through serve's logging, stamped
                # and formatted as the rest of serve's log.
                log_config=None,
                access_log=settings.access_log,
                timeout_graceful_shutdown=HTTP_STOP_SECONDS,
            )
        )
        sweeper = RetentionSweeper(
            engine,
            body_store,
            retention_period=settings.error_retention_period,
            event_retention_period=settings.event_log_retention_period,
        )
        # Cancelled at the stop; an unsent retry batch stays persisted for the next start.
        self._cancelled: dict[str, Callable[[], Awaitable[None]]] = {
            "retention": sweeper.run,
            "KPI sampler": sampler.run,
            "site-call purge": SiteCallRetention(engine, settings).run,
            "notification purge": NotificationRetention(engine, settings).run,
            "notification KPI sampler": NotificationKpiSampler(engine, settings).run,
        }
        if self._workers is not None:  # serve's IntakeHealth of each worker's intake
            every = settings.ingestion.report_interval_seconds
            self._cancelled["intake reports"] = lambda: report_intakes(engine, healths, every)
        if self._workers is None:  # else the workers send retries and notifications
            self._cancelled["retry processor"] = retry_processor.run
            self._cancelled["notification dispatch"] = Dispatcher(
                settings, engine, owner=str(uuid.uuid4())
            ).run
        if settings.sites:
            self._cancelled["reconciliation"] = reconciliation.run

    async def run(self, stop: asyncio.Event, on_serving: Callable[[Serving], None] | None) -> None:
        logging.getLogger("uvicorn.access").addFilter(_quiet_routine_telemetry)
        logging.getLogger("uvicorn.error").addFilter(_answers_cut_at_the_stop)
        stopped: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(
                    self._supervise("http", lambda: self._http.serve(sockets=[self._listener])),
                    name="http",
                )
                for name, intake in self._intakes.items():
                    consuming = functools.partial(self._consume_again, name, intake)
                    group.create_task(self._supervise(name, consuming), name=name)
                if self._workers is not None:
                    group.create_task(self._supervise("workers", self._workers.run))
                cancelled = [
                    group.create_task(self._supervise(name, part), name=name)
                    for name, part in self._cancelled.items()
                ]
                if on_serving is not None:
                    ingesting = bool(self._intakes) or self._workers is not None
                    on_serving(Serving(self._url(), ingesting=ingesting))
                await stop.wait()
                self._stopping = True
                # Every intake at once: each takes no more deliveries from now, and their
                # graces run together (docs/decisions.md "A stop finishes the batches in hand").
                await asyncio.gather(*(intake.stop() for intake in self._intakes.values()))
                if self._workers is not None:
                    await self._workers.stop()
                self._http.should_exit = True
                for task in cancelled:
                    task.cancel()
        except BaseExceptionGroup as group:
            stopped = group.exceptions[0]  # each was logged; the first one is the answer
        finally:
            logging.getLogger("uvicorn.access").removeFilter(_quiet_routine_telemetry)
            logging.getLogger("uvicorn.error").removeFilter(_answers_cut_at_the_stop)
        if stopped is not None:
            raise stopped  # its __cause__ is the part's own exception

    async def _supervise(self, name: str, part: Callable[[], Awaitable[None]]) -> None:
        """Run ``part``; while the service should run, its end is logged and raised as
        ``PartStopped`` (which makes the task group cancel the others)."""
        try:
            await part()
        except Exception as exc:
            if self._stopping:
                log.warning("%s failed while stopping", name, exc_info=exc)
                return
            log.error("%s stopped", name, exc_info=exc)
            raise PartStopped(name) from exc
        if not self._stopping:
            log.error("%s stopped on its own", name)
            raise PartStopped(name)

    async def _consume_again(
        self, name: str, intake: IngestionService | TelemetryIngestionService
    ) -> None:
        """Run an in-process ``intake`` (``ingestion.workers`` = 0) until it ends; when its
        consume fails with ``TransportError`` (RabbitMQ cancelled the consumer: its queue
        was deleted), log it and run it again, which declares the queue, after a pause that
        doubles as ``WorkerPool`` restarts a worker process."""
        delay = RESTART_MIN_SECONDS
        while True:
            started = time.monotonic()
            try:
                await intake.run()
                return
            except TransportError as exc:
                if self._stopping:
                    raise
                if time.monotonic() - started >= RESTART_RESET_SECONDS:
                    delay = RESTART_MIN_SECONDS
                # Not a failed write: health stays as the intake's writes leave it.
                log.error("%s: %s; consuming again in %.1f s", name, exc, delay)
                await asyncio.sleep(delay)
                delay = min(RESTART_MAX_SECONDS, delay * 2)

    def _url(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"http://{url_host(host)}:{port}"
