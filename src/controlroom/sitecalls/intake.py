"""Telemetry intake: the site-call telemetry queue -> batcher -> writer -> acknowledgements.

Source: docs/design.md "Process shape"; docs/decisions.md "Telemetry intake keeps what it
refuses". One packet per message (UTF-8 JSON
body, ``README`` "Site call telemetry"). Deliveries are acknowledged only after the
commit of every chunk of their batch; a packet the contract or the store refuses (or whose
validation fails unexpectedly) is kept whole in ``rejected_telemetry`` and acknowledged;
any other failure gives the whole batch back to the queue (replaying it is harmless: the
upsert is monotonic, the audit insert idempotent). A batch that reaches
``audit.request_budget`` (or one of whose packets runs past its own fresh budget) is
settled in part: what was written or rejected is acknowledged, the rest given back.

Every ``ingestion.report_interval_seconds`` the intake reads its queue's depth into its
``IntakeHealth`` and writes a change of health to the event log (``IntakeStalled``: its
queue has held packets for ``ingestion.stall_seconds`` with none stored, or its writes
fail; ``IntakeRecovered``: it stores again), as the error queue's intake does
(``events.observe_intake``, ``events.reporting_intake``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
import tenacity

from controlroom.config import Settings
from controlroom.db.engine import RunningStatements, retry_transient
from controlroom.db.errors import name_failure
from controlroom.events import SinceLastReport, observe_intake, reporting_intake
from controlroom.runtime.intake_health import IntakeHealth
from controlroom.sitecalls.writer import IngestBudgetExceeded, ReceivedPacket, SiteCallWriter
from controlroom.telemetry.contract import (
    TelemetryRejected,
    packet_bytes,
    parse_packet,
    validate_packet,
)
from controlroom.transport.base import Delivery, Transport, describe_depth
from controlroom.transport.batching import DeliveryBatcher, IntakeStop, ack_all, reject_all

log = logging.getLogger(__name__)

INTAKE_NAME = "telemetry intake"
"""The name its health goes by (``/api/health``, ``/metrics``)."""


def _unreadable(error: Exception) -> str:
    # Validation is pure: what escapes the contract for a packet (a bug) escapes it on
    # every replay too, so the packet is kept as rejected rather than given back forever.
    log.error("validating a telemetry packet failed unexpectedly", exc_info=error)
    return f"the packet could not be validated: {type(error).__name__}: {error}"


def receive_bytes(body: bytes, source: str, *, max_bytes: int | None = None) -> ReceivedPacket:
    """A packet as received from a queue: parsed, or with the contract's reason. A body
    of more than ``max_bytes`` (the queue path passes ``max_request_body_size``, what an
    HTTP request may hold) is refused unparsed, with its size as the reason (kept whole,
    as every rejected packet)."""
    if max_bytes is not None and len(body) > max_bytes:
        reason = (
            f"the packet is {len(body)} bytes, more than the {max_bytes} a packet may have "
            "(max_request_body_size)"
        )
        return ReceivedPacket(raw=body, source=source, rejected_because=reason)
    try:
        return ReceivedPacket(raw=body, source=source, packet=parse_packet(body))
    except TelemetryRejected as rejected:
        return ReceivedPacket(raw=body, source=source, rejected_because=rejected.reason)
    except Exception as error:
        return ReceivedPacket(raw=body, source=source, rejected_because=_unreadable(error))


def receive_json(data: Any, source: str, raw: bytes | None = None) -> ReceivedPacket:
    """A packet received decoded: ``data``, and ``raw`` its bytes as sent when the caller
    has them (an element of the HTTP body's array), kept if it is rejected; without them
    its JSON encoding is kept (a row a site answered a pull with)."""
    raw = packet_bytes(data) if raw is None else raw
    try:
        return ReceivedPacket(raw=raw, source=source, packet=validate_packet(data))
    except TelemetryRejected as rejected:
        return ReceivedPacket(raw=raw, source=source, rejected_because=rejected.reason)
    except Exception as error:
        return ReceivedPacket(raw=raw, source=source, rejected_because=_unreadable(error))


def make_writer(
    settings: Settings,
    engine: sa.Engine,
    stop_event: threading.Event | None = None,
    *,
    attempts: int | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    on_written: Callable[[], None] | None = None,
    on_failure: Callable[[BaseException], None] | None = None,
) -> SiteCallWriter:
    """The writer with the settings' budgets (``audit.ingest_budget``, ``row_budget``,
    ``request_budget``), measured with ``monotonic``. Transient store errors replay a
    chunk until ``stop_event`` is set (the queue: forever without one), or at most
    ``attempts`` times in all (an HTTP request, which must answer). ``on_written``: as
    ``SiteCallWriter`` takes it; ``on_failure`` is told each transient failure replayed
    (the intake's health: a store refusing writes for long is degraded)."""
    retrying = retry_transient(
        max_backoff_seconds=settings.ingestion.max_backoff_seconds,
        stop_event=stop_event,
        on_failure=on_failure,
    )
    if attempts is not None:
        retrying = retrying.copy(
            stop=tenacity.stop_after_attempt(attempts),
            wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
        )
    return SiteCallWriter(
        engine,
        chunk_budget=settings.audit.ingest_budget,
        row_budget=settings.audit.row_budget,
        request_budget=settings.audit.request_budget,
        retrying=retrying,
        monotonic=monotonic,
        on_written=on_written,
    )


class TelemetryIngestionService:
    """Drains the telemetry queue (``settings.telemetry_queue``) into the store until
    stopped. ``on_written`` is called after a batch stored a packet (``make_writer``)."""

    def __init__(
        self,
        settings: Settings,
        engine: sa.Engine,
        transport: Transport,
        *,
        on_written: Callable[[], None] | None = None,
    ) -> None:
        self._settings = settings
        self._engine = engine
        self._transport = transport
        self._statements = RunningStatements(f"the intake of {settings.telemetry_queue!r}")
        self._stop = IntakeStop(
            settings.ingestion.stop_grace_seconds, self._statements.cancel_at_grace_end
        )
        self.health = IntakeHealth(
            INTAKE_NAME,
            settings.telemetry_queue,
            stall_seconds=settings.ingestion.stall_seconds,
        )
        self._writer = make_writer(
            settings,
            engine,
            self._stop.retries_over,
            on_written=on_written,
            on_failure=lambda exc: self.health.failed(name_failure(exc)),
        )
        self._run_task: asyncio.Task[None] | None = None
        self._done = SinceLastReport("stored", "rejected")  # packets

    async def run(self) -> None:
        """Consume, batch and write until ``stop()`` or cancellation. Raises
        ``IntakeClosed`` when the transport stops delivering."""
        self._run_task = asyncio.current_task()
        batcher = DeliveryBatcher(
            self._transport,
            self._settings.telemetry_queue,
            self._settings.ingestion,
            self._ingest_batch,
        )
        every = self._settings.ingestion.report_interval_seconds
        # Its batches' statements, cancelled if the stop's grace ends while they wait.
        with self._statements.tracked():
            async with reporting_intake(every, self.report, intake=INTAKE_NAME):
                await batcher.run(self._stop.requested.is_set)

    async def report(self) -> None:
        """Read the telemetry queue's depth into ``health`` (a transport that cannot
        answer leaves it as it was) and write a change of health to the event log
        (module docstring; ``events.observe_intake``); while there is work (packets
        stored or kept since the last report, or waiting), log one line, as the error
        queue's intake does. The seconds are those since the last report."""
        queue = self._settings.telemetry_queue
        done, seconds = self._done.take()
        depth = await observe_intake(self._engine, self._transport, self.health)
        if any(done.values()) or (depth and depth.messages):
            self._say(done, seconds, f"; {describe_depth(depth, queue)}")

    def _say(self, done: dict[str, int], seconds: float, then: str) -> None:
        log.info(
            "stored %d telemetry packets (%.1f/s), kept %d in rejected_telemetry, from %s in "
            "the last %.0f s%s",
            done["stored"],
            done["stored"] / seconds,
            done["rejected"],
            self._settings.telemetry_queue,
            seconds,
            then,
        )

    def _count(self, reasons: list[str | None]) -> None:
        """Count packets written (reason ``None``) and kept as rejected, for ``report``."""
        rejected = sum(reason is not None for reason in reasons)
        self._done.counts["stored"] += len(reasons) - rejected
        self._done.counts["rejected"] += rejected

    async def stop(self) -> None:
        """Stop taking packets and finish the batches in hand (``IntakeStop``: a transient
        failure is retried for ``ingestion.stop_grace_seconds``, then the batch goes
        back); unacknowledged packets stay in the queue. Then says what it stored since
        its last report, if anything (no query: the store may be what held it)."""
        await self._stop.end(self._run_task)
        done, seconds = self._done.take()
        if any(done.values()):
            self._say(done, seconds, ", before the stop")

    async def _ingest_batch(self, deliveries: list[Delivery]) -> None:
        # Every delivery ends acknowledged after the commit, or given back: an exception
        # escaping this task would strand the batch unacknowledged and stall the intake.
        try:
            limit = self._settings.max_request_body_size
            received = [
                receive_bytes(delivery.body, delivery.queue, max_bytes=limit)
                for delivery in deliveries
            ]
            reasons = await asyncio.to_thread(self._writer.write, received)
        except IngestBudgetExceeded as stopped:
            await self._settle_in_part(deliveries, stopped)
            return
        except asyncio.CancelledError:
            await reject_all(deliveries)
            raise
        except Exception as exc:
            if not self._stop.requested.is_set():
                self.health.failed(name_failure(exc))
                log.exception(
                    "telemetry batch of %d not written; returned to the queue", len(deliveries)
                )
                await asyncio.sleep(self._settings.ingestion.max_backoff_seconds)
            else:
                log.warning(
                    "telemetry batch of %d not written before the stop (%s); returned to the queue",
                    len(deliveries),
                    name_failure(exc),
                )
            await reject_all(deliveries)
            return
        self.health.stored()
        await ack_all(deliveries)
        self._count(reasons)
        _log_rejections(reasons)

    async def _settle_in_part(
        self, deliveries: list[Delivery], stopped: IngestBudgetExceeded
    ) -> None:
        """Acknowledge what the stopped write did; give the unwritten rest back after the
        usual back-off (the store is slow: redelivering at once would press it more). A
        batch written in no part fails the intake's health, as a failed write does: the
        packets it holds are waiting in no queue, where a stall would be seen."""
        left = set(stopped.unwritten)
        done = [delivery for index, delivery in enumerate(deliveries) if index not in left]
        if done:
            self.health.stored()
        else:
            self.health.failed(f"no packet written within audit.request_budget ({stopped})")
        await ack_all(done)
        settled = [r for index, r in enumerate(stopped.reasons) if index not in left]
        self._count(settled)
        _log_rejections(settled)
        log.warning(
            "telemetry batch of %d stopped (%s): %d written or rejected, %d returned to the queue",
            len(deliveries),
            stopped,
            len(done),
            len(left),
        )
        if not self._stop.requested.is_set():
            await asyncio.sleep(self._settings.ingestion.max_backoff_seconds)
        await reject_all([deliveries[index] for index in sorted(left)])


def _log_rejections(reasons: list[str | None]) -> None:
    for reason in reasons:
        if reason is not None:
            log.warning("kept a telemetry packet in rejected_telemetry: %s", reason)
