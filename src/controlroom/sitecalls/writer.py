"""SiteCallWriter: telemetry packets into ``site_calls``, ``audit_log`` and
``rejected_telemetry``, chunk by chunk, each chunk one transaction with a time budget.

Source: docs/design.md "Audit log"; docs/decisions.md "Telemetry is refused, never
truncated" and "Audit ingest has a time budget per chunk".

- Packets are grouped by ``tracked_operation_id``; a chunk holds at most
  ``max_rows_per_statement`` ids (sorted, so concurrent writers lock in one order). Its
  transaction upserts each id's surviving state (``ordering.fold_states``) in one
  statement and inserts every audit event of its packets if absent (first write wins).
- A chunk has ``chunk_budget`` seconds. When it blows the budget or the store refuses its
  data, each of its packets is written alone, each with a fresh ``row_budget``, so one bad
  packet does not sink its neighbours; a blown chunk budget counts one failure
  (``BUDGET_EXCEEDED``), not one per row. A packet the store refuses alone is kept whole
  in ``rejected_telemetry`` with the store's reason.
- A call belongs to the site that reported it first: a packet naming another
  ``source_site`` than the stored row's (or, for a new call, than the chunk's first
  packet of it) is kept in ``rejected_telemetry`` with the reason
  (``contract.foreign_source``); the upsert's guard holds the same rule.
- A packet of a call the retention purge deleted, while its tombstone is kept, is kept in
  ``rejected_telemetry`` with the reason (``sitecalls.tombstones``): a late replay never
  brings a purged call back.
- A packet the store refuses alone is rejected with a reason naming its field and the
  rule it breaks when the packet shows which (a value longer than its column, text no
  store holds), else the driver's own first line (``describe_store_error``): never the
  statement's text.
- A whole write (an HTTP request, a queue batch, a reconciliation page) has
  ``request_budget`` seconds: no chunk or lone packet runs past it, and what is left when
  it is spent is not written. The write then raises ``IngestBudgetExceeded`` saying what
  was done (``reasons``) and what was not (``unwritten``), so the caller acknowledges
  the one and gives back the other. A packet that blows its own fresh ``row_budget``
  ends the write the same way.
- Transient store errors replay the chunk (``retrying``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
import tenacity
from prometheus_client import Counter

from controlroom.db.counts import fold_counts
from controlroom.db.engine import retry_transient
from controlroom.db.errors import classify_store_error, describe_store_error
from controlroom.db.providers import Provider, Row, chunked, provider_for
from controlroom.db.tables import audit_log, rejected_telemetry, site_call_counts, site_calls
from controlroom.db.transactions import begin_write
from controlroom.exceptions import ControlroomError, ErrorKind
from controlroom.runtime.clock import Clock, utc_now
from controlroom.runtime.wire_text import storable_text
from controlroom.sitecalls.tombstones import bury, tombstone_reason, tombstones_of
from controlroom.sitecalls.upsert import stored_owners, upsert_site_calls
from controlroom.telemetry.contract import TelemetryPacket, foreign_source, rejection_id
from controlroom.telemetry.ordering import fold_states
from controlroom.telemetry.stamps import stamp_values

log = logging.getLogger(__name__)

FOLD_AFTER_CALLS = 2_000
"""A writer folds the site-call counts after every this many packets it took: at most one
count row per statement and key changed (docs/decisions.md "The database keeps the
counts"), so the rows a KPI reading sums stay near this bound without a reader."""

BUDGET_EXCEEDED = Counter(
    "controlroom_sitecall_ingest_budget_exceeded_total",
    "Telemetry chunks (or lone packets) that ran past their time budget",
)
REQUEST_BUDGET_EXCEEDED = Counter(
    "controlroom_sitecall_request_budget_exceeded_total",
    "Telemetry writes (a request, a queue batch, a page) that stopped at audit.request_budget "
    "with packets left unwritten",
)
PACKETS = Counter(
    "controlroom_sitecall_packets_total", "Telemetry packets taken in, by outcome", ["outcome"]
)


class IngestBudgetExceeded(ControlroomError):
    """A write stopped at a time budget (the request's, or a lone packet's fresh one).

    ``unwritten`` lists the positions of the packets of which nothing was committed (in
    ascending order; give them back or send them again). ``reasons`` holds, per packet of
    the write, ``None`` when it was taken or why it was rejected (kept in
    ``rejected_telemetry``); an unwritten packet's entry is ``None`` and means nothing."""

    def __init__(self, message: str, *, reasons: list[str | None], unwritten: list[int]) -> None:
        super().__init__(message)
        self.reasons = reasons
        self.unwritten = unwritten


@dataclass(frozen=True, slots=True)
class ReceivedPacket:
    """One packet as received: its bytes (kept whole when rejected), where it came from
    (a queue name or ``"http"``), and the validated packet or the contract's reason."""

    raw: bytes
    source: str
    packet: TelemetryPacket | None = None
    rejected_because: str | None = None


def site_call_row(packet: TelemetryPacket, now: datetime) -> dict[str, Any]:
    """The ``site_calls`` row ``packet`` would be if it won."""
    return {
        "tracked_operation_id": packet.tracked_operation_id,
        "channel": packet.channel.value,
        "target": packet.target,
        "source_site": packet.source_site,
        "source_node": packet.source_node,
        "status": packet.status.value,
        "retry_count": packet.retry_count,
        "last_error": packet.last_error,
        "http_status": packet.http_status,
        **stamp_values("created_at", packet.created_at_utc),
        **stamp_values("updated_at", packet.updated_at_utc),
        **stamp_values("terminal_at", packet.terminal_at_utc),
        "ingested_at_utc": now,
        "epoch": packet.epoch,
    }


def audit_row(packet: TelemetryPacket, now: datetime) -> dict[str, Any] | None:
    """The ``audit_log`` row of ``packet``'s audit event, ``None`` without one. The event
    names its own node when it says; its correlation id defaults to the packet's
    ``tracked_operation_id``."""
    event = packet.audit_event
    if event is None:
        return None
    return {
        "event_id": event.event_id,
        **stamp_values("occurred_at", event.occurred_at_utc),
        "ingested_at_utc": now,
        "actor": event.actor,
        "action": event.action,
        "outcome": event.outcome,
        "category": event.category,
        "target": event.target,
        "source_site": packet.source_site,
        "source_node": event.source_node if event.source_node is not None else packet.source_node,
        "correlation_id": event.correlation_id or packet.tracked_operation_id,
        "details_json": event.details_json,
        "payload_truncated": event.payload_truncated,
    }


def store_refusal(packet: TelemetryPacket, error: BaseException) -> str:
    """Why the store refused ``packet`` written alone: its first value the store cannot
    hold, by field and rule (a text longer than its column, a NUL, an unpaired
    surrogate), else the driver's exception in one line (``describe_store_error``)."""
    now = utc_now()
    rows = [("", site_calls, site_call_row(packet, now))]
    event = audit_row(packet, now)
    if event is not None:
        rows.append(("audit_event.", audit_log, event))
    for prefix, table, row in rows:
        for name, value in row.items():
            if isinstance(value, str):
                rule = _unstorable(value, getattr(table.c[name].type, "length", None))
                if rule is not None:
                    return f"{prefix}{name}: {rule} (the store refused the packet)"
    return f"the store refused the packet: {describe_store_error(error)}"


def _unstorable(value: str, width: int | None) -> str | None:
    if width is not None and len(value) > width:
        return f"longer than its column's {width} characters"
    if "\x00" in value:
        return "must not contain a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode text (an unpaired surrogate)"
    return None


class _BudgetBlown(Exception):
    """Internal: the running chunk or packet passed its deadline."""


class SiteCallWriter:
    """Writes received telemetry; safe to use from several threads."""

    def __init__(
        self,
        engine: sa.Engine,
        *,
        chunk_budget: float = 20.0,
        row_budget: float = 5.0,
        request_budget: float | None = None,
        retrying: tenacity.Retrying | None = None,
        clock: Clock = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
        on_written: Callable[[], None] | None = None,
    ) -> None:
        """Budgets in seconds; ``request_budget`` ``None``: a write is bounded by its
        chunks' budgets only. ``on_written`` is called after a write that stored at
        least one packet (the KPI sampler's cue, ``KpiSampler.intake_written``)."""
        self._engine = engine
        self._provider: Provider = provider_for(engine)
        self._chunk_budget = chunk_budget
        self._row_budget = row_budget
        self._request_budget = request_budget
        self._retrying = retrying or retry_transient()
        self._clock = clock
        self._monotonic = monotonic
        self._on_written = on_written
        self._unfolded = 0

    def write(self, received: Sequence[ReceivedPacket]) -> list[str | None]:
        """Write ``received``; returns, per packet in order, ``None`` when it was taken
        (stored, or a no-op under the monotonic rule) or the reason it was rejected (it
        is then in ``rejected_telemetry``).

        Raises ``IngestBudgetExceeded`` (what was done, what was left unwritten: the
        rejected packets of the done part are kept first) or a store error that is
        neither transient nor the data's fault; some chunks may be committed by then
        (replaying is harmless).
        """
        cap = None if self._request_budget is None else self._monotonic() + self._request_budget
        reasons: list[str | None] = [item.rejected_because for item in received]
        by_id: dict[str, list[int]] = {}
        for index, item in enumerate(received):
            if item.packet is not None and item.rejected_because is None:
                by_id.setdefault(item.packet.tracked_operation_id, []).append(index)
        unwritten: list[int] = []
        stopped: str | None = None
        for id_chunk in chunked(sorted(by_id), self._provider.max_rows_per_statement):
            indexes = [index for key in id_chunk for index in by_id[key]]
            if stopped is not None:
                unwritten.extend(indexes)
                continue
            packets = [received[index].packet for index in indexes]
            try:
                refused = self._retrying(self._write_chunk, packets, self._chunk_budget, cap)
            except _BudgetBlown:
                if self._spent(cap):
                    stopped = self._request_spent(len(received))
                    unwritten.extend(indexes)
                    continue
                BUDGET_EXCEEDED.inc()  # once for the chunk, whatever its rows do next
                log.warning("a telemetry chunk of %d packets ran past its budget", len(packets))
                stopped = self._write_alone(received, indexes, reasons, cap, unwritten)
            except Exception as exc:
                if classify_store_error(exc) is not ErrorKind.DATA:
                    raise
                stopped = self._write_alone(received, indexes, reasons, cap, unwritten)
            else:
                for index, reason in zip(indexes, refused, strict=True):
                    reasons[index] = reason
        reasons = [None if reason is None else storable_text(reason) for reason in reasons]
        rejected = [
            (received[index], reason) for index, reason in enumerate(reasons) if reason is not None
        ]
        if rejected:
            self._retrying(self._keep_rejected, rejected)
        PACKETS.labels("rejected").inc(len(rejected))
        accepted = len(received) - len(rejected) - len(unwritten)
        PACKETS.labels("accepted").inc(accepted)
        if accepted and self._on_written is not None:
            self._on_written()
        self._fold_counts(accepted)
        if stopped is not None:
            raise IngestBudgetExceeded(stopped, reasons=reasons, unwritten=sorted(unwritten))
        return reasons

    def _fold_counts(self, written: int) -> None:
        """Fold the site-call counts (``db.counts.fold_counts``) after every
        ``FOLD_AFTER_CALLS`` packets this writer took, after their commit, so that a busy
        writer keeps them bounded without a reader. Unlocked: two threads may count the
        same packets, which only folds a little earlier. A failure is logged; the next
        fold takes what this one left."""
        self._unfolded += written
        if self._unfolded < FOLD_AFTER_CALLS:
            return
        self._unfolded = 0
        try:
            fold_counts(self._engine, site_call_counts)
        except sa.exc.DBAPIError:
            log.warning(
                "folding the site-call counts failed; the next fold takes them", exc_info=True
            )

    def _spent(self, cap: float | None) -> bool:
        return cap is not None and self._monotonic() >= cap

    def _request_spent(self, count: int) -> str:
        REQUEST_BUDGET_EXCEEDED.inc()
        log.warning(
            "a telemetry write of %d packets reached audit.request_budget (%s s); the rest "
            "is given back",
            count,
            self._request_budget,
        )
        return (
            f"the store did not write every packet within the request's budget of "
            f"{self._request_budget} s"
        )

    def _write_alone(
        self,
        received: Sequence[ReceivedPacket],
        indexes: Sequence[int],
        reasons: list[str | None],
        cap: float | None,
        unwritten: list[int],
    ) -> str | None:
        """Per-row fallback: each packet its own transaction with a fresh budget (within
        the request's). Returns why the write must stop (the packets from the one that
        ran out on are added to ``unwritten``), or ``None``."""
        for position, index in enumerate(indexes):
            packet = received[index].packet
            assert packet is not None
            try:
                (reasons[index],) = self._retrying(
                    self._write_chunk, [packet], self._row_budget, cap
                )
            except _BudgetBlown:
                unwritten.extend(indexes[position:])
                if self._spent(cap):
                    return self._request_spent(len(received))
                BUDGET_EXCEEDED.inc()
                return (
                    f"the store did not write packet {index} within its fresh budget of "
                    f"{self._row_budget} s"
                )
            except Exception as exc:
                if classify_store_error(exc) is not ErrorKind.DATA:
                    raise
                reasons[index] = store_refusal(packet, exc)
        return None

    def _write_chunk(
        self, packets: Sequence[TelemetryPacket], budget: float, cap: float | None
    ) -> list[str | None]:
        """Write ``packets`` in one transaction within ``budget`` seconds and before
        ``cap`` (``time.monotonic`` time; ``None``: no cap); returns, per packet, ``None``
        or why it was refused (it names another site than its call's:
        ``contract.foreign_source``; its call was purged: ``tombstones.tombstone_reason``)."""
        now = self._clock()
        deadline = self._monotonic() + budget
        if cap is not None:
            deadline = min(deadline, cap)
        with begin_write(self._engine) as conn, self._within(conn, deadline):
            self._check(deadline)
            # A call's owner is its stored site, else the first packet's of this chunk.
            owners = stored_owners(conn, sorted({p.tracked_operation_id for p in packets}))
            refused = [
                foreign_source(
                    packet.source_site,
                    owners.setdefault(packet.tracked_operation_id, packet.source_site),
                )
                for packet in packets
            ]
            by_id: dict[str, list[TelemetryPacket]] = {}
            for packet, reason in zip(packets, refused, strict=True):
                if reason is None:
                    by_id.setdefault(packet.tracked_operation_id, []).append(packet)
            rows = [site_call_row(fold_states(by_id[key]), now) for key in sorted(by_id)]
            self._check(deadline)
            upsert_site_calls(conn, self._provider, rows)
            self._check(deadline)
            # Read after the upsert: a purge that committed while the upsert waited for
            # its row is seen (each statement sees what committed before it), and what
            # the upsert wrote for a purged call is deleted again in this transaction.
            purged = tombstones_of(conn, self._provider, by_id)
            bury(conn, purged)
            events: dict[str, dict[str, Any]] = {}
            for index, packet in enumerate(packets):
                terminal = purged.get(packet.tracked_operation_id)
                if terminal is not None and refused[index] is None:
                    refused[index] = tombstone_reason(terminal)
                row = audit_row(packet, now) if refused[index] is None else None
                if row is not None:
                    events.setdefault(row["event_id"], row)  # the first of a batch wins too
            self._check(deadline)
            self._provider.insert_audit_events(conn, [events[key] for key in sorted(events)])
            self._check(deadline)
        return refused

    @contextmanager
    def _within(self, conn: sa.Connection, deadline: float) -> Iterator[None]:
        remaining = deadline - self._monotonic()
        if remaining <= 0:
            raise _BudgetBlown
        try:
            with self._provider.limit_statement_time(conn, remaining):
                yield
        except _BudgetBlown:
            raise
        except Exception as exc:
            # A statement the provider cancelled at the deadline shows as its driver's
            # error; past the deadline it means the budget, whatever the error says.
            if self._monotonic() >= deadline:
                raise _BudgetBlown from exc
            raise

    def _check(self, deadline: float) -> None:
        if self._monotonic() >= deadline:
            raise _BudgetBlown

    def _keep_rejected(self, rejected: Sequence[tuple[ReceivedPacket, str]]) -> None:
        now = self._clock()
        rows: dict[str, Row] = {}
        for item, reason in rejected:
            key = rejection_id(item.raw)
            rows.setdefault(
                key,
                {
                    "id": key,
                    "source": item.source,
                    "packet": item.raw,
                    "reason": reason,
                    "rejected_at_utc": now,
                },
            )
        with begin_write(self._engine) as conn:
            self._provider.insert_rows_if_absent(
                conn, rejected_telemetry, [rows[key] for key in sorted(rows)]
            )
