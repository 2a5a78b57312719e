"""The ingestion pipeline: error queue -> batcher -> unit of work -> writer -> acknowledgements.

Source: docs/design.md "Process shape", "Unit of work", "Transient failures", "Failed imports".

- ``record_*`` calls of the unit of work only enqueue; ``complete`` waits for the batch's
  external body writes, then hands the batch to the writer (one transaction).
- Deliveries are acknowledged only after the commit of the batch that holds them.
- A message that cannot be ingested for a reason of its own is kept whole as a failed
  import (in the same transaction) and acknowledged.
- A transient store failure retries the whole batch with a capped back-off until it
  succeeds, or until ``ingestion.stop_grace_seconds`` after the service was told to stop;
  the messages stay unacknowledged in the queue meanwhile.
- A batch the store refuses for its data is written message by message, so only the
  message at fault becomes a failed import.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from prometheus_client import Counter, Gauge, Histogram

from controlroom.config import Settings
from controlroom.db.engine import RunningStatements, retry_transient
from controlroom.db.errors import classify_store_error, name_failure
from controlroom.errors.ingest.bodies import BodyStore
from controlroom.errors.ingest.headers import TEXT_ONLY
from controlroom.errors.ingest.identity import failed_import_id
from controlroom.errors.ingest.parsing import is_retry_confirmation, parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt, FailedImport, KnownEndpoint
from controlroom.events import SinceLastReport, observe_intake, reporting_intake
from controlroom.exceptions import ErrorKind, MessageRejected
from controlroom.runtime.clock import utc_now
from controlroom.runtime.intake_health import IntakeHealth
from controlroom.runtime.wire_text import escape_wire_text
from controlroom.transport.base import (
    UNREADABLE_HEADER,
    Delivery,
    Transport,
    describe_depth,
)
from controlroom.transport.batching import (  # IntakeClosed: raised by run()
    DeliveryBatcher,
    IntakeClosed,
    IntakeStop,
    ack_all,
    reject_all,
)

log = logging.getLogger(__name__)

INTAKE_NAME = "error queue intake"
"""The name its health goes by (``/api/health``, ``/metrics``)."""

__all__ = ["IngestionService", "IngestionUnitOfWork", "IntakeClosed"]

INGESTED = Counter(
    "controlroom_ingested_messages_total",
    "Messages taken from the error queue, by outcome",
    ["outcome"],
)
BATCH_SECONDS = Histogram(
    "controlroom_ingestion_batch_seconds", "Time to parse, write and acknowledge one batch"
)
QUEUE_DEPTH = Gauge(
    "controlroom_queue_depth_messages",
    "Messages waiting (ready, not in flight) in the error queue, sampled every report interval",
    ["queue"],
)
QUEUE_LAG = Gauge(
    "controlroom_queue_lag_seconds",
    "Age of the oldest message waiting in the error queue, where the transport tells it",
    ["queue"],
)


def make_failed_import(
    headers: Mapping[str, str | None], body: bytes, *, queue: str, reason: str
) -> FailedImport:
    """Keep a message whole: headers as ASCII-escaped JSON (storable anywhere), raw body."""
    headers_json = json.dumps(dict(headers), sort_keys=True, ensure_ascii=True, default=str)
    return FailedImport(
        id=failed_import_id(headers, headers_json, body),
        queue=queue,
        headers_json=headers_json,
        body=body,
        reason=reason,
        failed_at=utc_now(),
    )


class IngestionUnitOfWork:
    """One batch in the making. Not thread-safe; used from one event loop task."""

    def __init__(self, writer: FailedMessageBatchWriter, body_store: BodyStore) -> None:
        self._writer = writer
        self._body_store = body_store
        self._batch = IngestionBatch()
        self._body_writes: dict[str, asyncio.Task[None]] = {}

    def record_failed_processing_attempt(self, attempt: FailedAttempt) -> None:
        """Enqueue an attempt; starts its external body write when it has one."""
        self._batch.attempts.append(attempt)
        key = attempt.body_key
        if attempt.body_placement.external and key and key not in self._body_writes:
            self._body_writes[key] = asyncio.create_task(
                asyncio.to_thread(self._body_store.put, key, attempt.body)
            )

    def record_known_endpoint(self, endpoint: KnownEndpoint) -> None:
        self._batch.endpoints.append(endpoint)

    def record_successful_retry(self, unique_message_id: str) -> None:
        self._batch.confirmed_retries.append(unique_message_id)

    def record_failed_import(self, failed_import: FailedImport) -> None:
        self._batch.failed_imports.append(failed_import)

    async def complete(self) -> None:
        """Wait for every external body write, then write the batch in one transaction.

        Raises ``BodyStoreError`` (nothing is committed) or the writer's store error.
        """
        writes = list(self._body_writes.values())
        results = await asyncio.gather(*writes, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        await asyncio.to_thread(self._writer.write, self._batch)


@dataclass(frozen=True, slots=True)
class _Parsed:
    """What one delivery contributes to a unit of work."""

    attempt: FailedAttempt | None = None
    confirmed_retry: str | None = None
    failed_import: FailedImport | None = None


class IngestionService:
    """Drains the error queue into the store until stopped."""

    def __init__(
        self,
        settings: Settings,
        engine: sa.Engine,
        transport: Transport,
        body_store: BodyStore,
    ) -> None:
        self._settings = settings
        self._transport = transport
        self._body_store = body_store
        self._statements = RunningStatements(f"the intake of {settings.error_queue!r}")
        self._stop = IntakeStop(
            settings.ingestion.stop_grace_seconds, self._statements.cancel_at_grace_end
        )
        self._engine = engine
        self.health = IntakeHealth(
            INTAKE_NAME,
            settings.error_queue,
            stall_seconds=settings.ingestion.stall_seconds,
        )
        # A transient failure replayed in place never reaches ``_give_back``: the
        # retry policy tells ``health`` of it.
        retrying = retry_transient(
            max_backoff_seconds=settings.ingestion.max_backoff_seconds,
            stop_event=self._stop.retries_over,
            on_failure=lambda exc: self.health.failed(name_failure(exc)),
        )
        self._writer = FailedMessageBatchWriter(
            engine,
            retrying=retrying,
            body_store=body_store,
            alert_group_failures=settings.ingestion.alert_group_failures_per_hour,
            alert_endpoint_failures=settings.ingestion.alert_endpoint_failures_per_hour,
        )
        self._run_task: asyncio.Task[None] | None = None
        self._done = SinceLastReport("failed_message", "failed_import", "retry_confirmation")

    async def run(self) -> None:
        """Consume, batch and write until ``stop()`` or cancellation."""
        self._run_task = asyncio.current_task()
        batcher = DeliveryBatcher(
            self._transport,
            self._settings.error_queue,
            self._settings.ingestion,
            self._ingest_batch,
        )
        every = self._settings.ingestion.report_interval_seconds
        # Its batches' statements, cancelled if the stop's grace ends while they wait.
        with self._statements.tracked():
            async with reporting_intake(every, self.report, intake=INTAKE_NAME):
                await batcher.run(self._stop.requested.is_set)

    async def stop(self) -> None:
        """Stop taking messages and finish the batches in hand (``IntakeStop``: a
        transient failure is retried for ``ingestion.stop_grace_seconds``, then the batch
        goes back); unacknowledged messages stay in the queue. Then says what it stored
        since its last report, if anything (no query: the store may be what held it)."""
        await self._stop.end(self._run_task)
        done, seconds = self._done.take()
        if any(done.values()):
            self._say(done, seconds, ", before the stop")

    async def report(self) -> None:
        """Sample the error queue's depth into ``QUEUE_DEPTH``/``QUEUE_LAG`` and, while there
        is work (messages done since the last report, or waiting), log one line: messages
        stored per second, failed imports, retry confirmations and the queue's depth
        (docs/decisions.md "Metrics are labelled by route template", "serve says what it is
        doing"). A transport that cannot answer leaves the depth out. The seconds are those
        since the last report, not the interval: a worker kept from the CPU reports late."""
        queue = self._settings.error_queue
        done, seconds = self._done.take()
        depth = await observe_intake(self._engine, self._transport, self.health)
        if depth is not None:
            QUEUE_DEPTH.labels(queue).set(depth.messages)
            if depth.oldest_age_seconds is not None:
                QUEUE_LAG.labels(queue).set(depth.oldest_age_seconds)
        if any(done.values()) or (depth and depth.messages):
            self._say(done, seconds, f"; {describe_depth(depth, queue)}")

    def _say(self, done: dict[str, int], seconds: float, then: str) -> None:
        log.info(
            "ingested %d failed messages (%.1f/s), %d failed imports, %d retry confirmations "
            "from %s in the last %.0f s%s",
            done["failed_message"],
            done["failed_message"] / seconds,
            done["failed_import"],
            done["retry_confirmation"],
            self._settings.error_queue,
            seconds,
            then,
        )

    async def _ingest_batch(self, deliveries: list[Delivery]) -> None:
        """Ingest one batch; every exit settles every delivery exactly once
        (docs/decisions.md "Every delivery is settled exactly once"): committed and acknowledged,
        failed import and acknowledged, or given back for redelivery. Any exception other than a
        data error of the whole batch gives the batch back, including one raised by the one-by-one
        fallback (messages it already committed come back and replay harmlessly)."""
        started = time.monotonic()
        try:
            # Off the event loop: parsing (headers, UTF-8 checks, body placement) is CPU work
            # that would otherwise delay every HTTP answer while ingesting.
            parsed = await asyncio.to_thread(self._parse_all, deliveries)
            try:
                await self._write(parsed)
            except Exception as exc:
                if classify_store_error(exc) is not ErrorKind.DATA:
                    raise
                parsed = await self._write_one_by_one(deliveries, parsed)
        except asyncio.CancelledError:
            await reject_all(deliveries)
            raise
        except Exception as exc:
            await self._give_back(deliveries, exc)
            return
        self.health.stored()
        await ack_all(deliveries)
        for outcome in _count_outcomes(parsed):
            self._done.counts[outcome] += 1
        BATCH_SECONDS.observe(time.monotonic() - started)

    async def _write(self, parsed: Sequence[_Parsed]) -> None:
        unit = IngestionUnitOfWork(self._writer, self._body_store)
        for item in parsed:
            if item.attempt is not None:
                unit.record_failed_processing_attempt(item.attempt)
                for endpoint in item.attempt.endpoints:
                    unit.record_known_endpoint(endpoint)
            if item.confirmed_retry is not None:
                unit.record_successful_retry(item.confirmed_retry)
            if item.failed_import is not None:
                unit.record_failed_import(item.failed_import)
        await unit.complete()

    async def _write_one_by_one(
        self, deliveries: Sequence[Delivery], parsed: Sequence[_Parsed]
    ) -> list[_Parsed]:
        """Isolate the messages the store refuses; each becomes a failed import."""
        outcome: list[_Parsed] = []
        for delivery, item in zip(deliveries, parsed, strict=True):
            try:
                await self._write([item])
            except Exception as exc:
                if classify_store_error(exc) is not ErrorKind.DATA:
                    raise
                reason = f"the store refused the message: {type(exc).__name__}: {exc}"
                item = _Parsed(failed_import=self._failed_import(delivery, reason))
                await self._write([item])
            outcome.append(item)
        return outcome

    async def _give_back(self, deliveries: Sequence[Delivery], exc: Exception) -> None:
        """Infrastructure failure: never a failed import; the messages go back to the queue."""
        if not self._stop.requested.is_set():
            self.health.failed(name_failure(exc))
            log.error(
                "batch of %d not written; returned to the queue", len(deliveries), exc_info=exc
            )
            INGESTED.labels("returned").inc(len(deliveries))
            await asyncio.sleep(self._settings.ingestion.max_backoff_seconds)
        else:
            log.warning(
                "batch of %d not written before the stop (%s); returned to the queue",
                len(deliveries),
                name_failure(exc),
            )
        await reject_all(deliveries)

    def _parse_all(self, deliveries: Sequence[Delivery]) -> list[_Parsed]:
        return [self._parse(delivery) for delivery in deliveries]

    def _parse(self, delivery: Delivery) -> _Parsed:
        unreadable = delivery.headers.get(UNREADABLE_HEADER)
        if unreadable is not None:
            reason = f"the queue could not read the message whole: {unreadable}"
            return _Parsed(failed_import=self._failed_import(delivery, reason))
        broken = _first_not_utf8(delivery.headers)
        if broken is not None:
            # A transport hands over bytes that were not UTF-8 as lone surrogates; the
            # message is kept whole (escaped in the headers JSON), never ingested half.
            return _Parsed(failed_import=self._failed_import(delivery, broken))
        structured = _first_structured(delivery.structured)
        if structured is not None:
            return _Parsed(failed_import=self._failed_import(delivery, structured))
        try:
            confirmed = is_retry_confirmation(delivery.headers)
            if confirmed is not None:
                return _Parsed(confirmed_retry=confirmed)
            return _Parsed(
                attempt=parse_failed_message(
                    delivery.headers,
                    delivery.body,
                    max_body_size_to_store=self._settings.max_body_size_to_store,
                )
            )
        except MessageRejected as rejected:
            return _Parsed(failed_import=self._failed_import(delivery, rejected.reason))
        except Exception as exc:  # the message's content broke parsing: keep it, say why
            log.exception("could not parse a message from %s", self._settings.error_queue)
            reason = f"could not parse the message: {type(exc).__name__}: {exc}"
            return _Parsed(failed_import=self._failed_import(delivery, reason))

    def _failed_import(self, delivery: Delivery, reason: str) -> FailedImport:
        return make_failed_import(
            delivery.headers, delivery.body, queue=self._settings.error_queue, reason=reason
        )


def _first_structured(structured: Mapping[str, str]) -> str | None:
    """The reason to keep a message whose identity header is a table or an array, else
    ``None`` (``headers.TEXT_ONLY``)."""
    for name in TEXT_ONLY:
        kind = structured.get(name)
        if kind is not None:
            return f"header {name!r} holds {kind}, where the wire contract reads text"
    return None


def _first_not_utf8(headers: Mapping[str, str | None]) -> str | None:
    """The reason to keep a message whose header names or values are not UTF-8, else
    ``None`` (docs/decisions.md "Headers that are not UTF-8 make a failed import")."""
    for name, value in headers.items():
        if not _is_utf8(name):
            return f"header name '{escape_wire_text(name)}' is not UTF-8"
        if value is not None and not _is_utf8(value):
            return f"the value of header {name!r} is not UTF-8"
    return None


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _count_outcomes(parsed: Sequence[_Parsed]) -> list[str]:
    """Count each item's outcome (``INGESTED``); returns the outcome names, in order."""
    outcomes = []
    for item in parsed:
        if item.failed_import is not None:
            outcomes.append("failed_import")
            INGESTED.labels("failed_import").inc()
            # Operators learn of it here; `controlroom import-failed` re-imports it.
            log.warning(
                "kept message as failed import %s: %s",
                item.failed_import.id,
                item.failed_import.reason,
            )
        elif item.confirmed_retry is not None:
            outcomes.append("retry_confirmation")
            INGESTED.labels("retry_confirmation").inc()
        else:
            outcomes.append("failed_message")
            INGESTED.labels("failed_message").inc()
    return outcomes
