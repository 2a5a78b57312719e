"""The retry processor: stages and forwards retry batches, resuming where a restart left them.

Source: docs/decisions.md "Retries are staged, then forwarded, and survive a restart";
ServiceControl's ``RetryProcessor`` (staging, then forwarding) adapted to
a relational store: the stage of every batch and the send state of every claim are rows,
so a process that dies at any point leaves a state the next one continues from.

- **Staging** (one transaction): claims whose message is no longer RetryIssued (archived,
  resolved or failed again since the request) are dropped; every other claim gets an
  attempt id (ServiceControl's ``Retry.Attempt.MessageId``, kept as bookkeeping and, as
  in ServiceControl, not sent to the endpoint) and its target: the queue it failed in,
  or that queue's redirect in force now (``/api/redirects``); the batch moves to
  ``forwarding``.
- **Forwarding**: the unsent claims, ``FORWARD_WINDOW`` at a time, are sent through the
  transport, which returns only once the broker confirmed the message (publisher
  confirms on RabbitMQ, a durable commit on the embedded queue); a claim is marked sent
  only after that. A crash between the confirm and the mark re-sends that message: at
  least once, never lost. When no unsent claim is left, the batch is ``done``.
- A Python task's message (its headers carry ``Controlroom.TaskQueue.Properties``) goes
  out as its producer sent it: those broker properties and typed header table, plus the
  retry headers (``retry_wire.outgoing_message``; docs/design.md "Python task queues").
- A message that cannot be sent for a reason of its own (``retry_wire.UnsendableMessage``:
  no queue in its address, unreadable headers or task properties, body missing from the
  body store, a Python task's body that was not kept) loses its claim, becomes Unresolved
  again and marks the operation failed, with the reason in its ``failure_reason`` and a
  ``RetryMessagesUnsendable`` item in the event log; a transport or store failure leaves
  everything in place and the processor backs off and tries again.
- A send that fails while the broker is otherwise reachable (it refuses this message or
  queue) counts against the claim's ``stage_attempts``; after ``MAX_SEND_ATTEMPTS``
  (ServiceControl's bound) the claim is given up: the message is Unresolved again, the
  operation is marked failed with the reason, and the event log says so. A failing batch
  never holds back the batches after it: each pass tries every pending batch
  (docs/decisions.md "A refused retry is given up after five sends"). Failures while the broker is
  unreachable do not count.

One process forwards at a time: the processor holds a lease (``controlroom.db.leases``: a
PostgreSQL advisory lock, a lease row on SQLite) and re-checks it before every window.
A window's claims are marked in flight (``in_flight_until``), in a transaction that locks
them, before any is sent, so a process that took the lease over while another's window was
still being sent (its session ended, or it paused past the lease) takes only other
claims, and finishes the batch once that window is recorded (docs/decisions.md "A window
in flight is claimed"). A window whose process died is sent again once its mark is past.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from prometheus_client import Counter

from controlroom.config import Settings
from controlroom.db.engine import begin_write
from controlroom.db.providers import provider_for
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_retries,
    failed_messages,
    retry_batches,
    retry_operations,
)
from controlroom.errors import activity
from controlroom.errors.ingest.bodies import BodyNotFoundError, BodyStore
from controlroom.errors.read.redirects import redirect_targets
from controlroom.errors.retries import wire as retry_wire
from controlroom.errors.retries.requests import (
    BatchStatus,
    close_abandoned_preparations,
    complete_operation_if_finished,
)
from controlroom.errors.retries.wire import UnsendableMessage
from controlroom.exceptions import ControlroomError
from controlroom.runtime.clock import Clock, utc_now
from controlroom.runtime.periodic import PeriodicTask
from controlroom.transport.base import Transport

log = logging.getLogger(__name__)

fm = failed_messages.c
fmr = failed_message_retries.c
rb = retry_batches.c
ro = retry_operations.c

LEASE_NAME = "controlroom.retry-processor"
FORWARD_WINDOW = 32
"""Messages published concurrently before their sent marks are written in one commit."""

MAX_SEND_ATTEMPTS = 5
"""Failed sends of one claim, with the broker reachable, before it is given up
(ServiceControl's retry processor gives up a batch after 5 staging attempts)."""

_BODY_MISSING = "its body is missing from the body store"
_HEADERS_UNREADABLE = "its stored headers cannot be read"

RETRIED = Counter(
    "controlroom_retried_messages_total", "Claimed retry messages, by outcome", ["outcome"]
)


class LeaseLost(ControlroomError):
    """Another process may hold the retry processor's lease now; this one must stop."""


@dataclass(frozen=True, slots=True)
class _Claim:
    """One unsent claim of a batch and what is needed to send it."""

    failed_message_id: str
    attempt_message_id: str | None
    destination: str | None
    status: int | None  # None: the failed message is gone
    headers_json: str | None
    content_type: str | None
    body_text: str | None
    body_stored_externally: bool | None
    body_key: str | None


@dataclass
class _Window:
    """What happened to one window of claims."""

    sent: list[str]
    dropped: list[str]  # no longer RetryIssued: not sent, claim removed
    unsendable: dict[str, UnsendableMessage]  # id -> why
    failed: list[str]  # transient failure: stays unsent
    error: BaseException | None = None
    counts: bool = False  # the failures count against the claims' attempts


class RetryProcessor:
    """Moves retry batches through staging and forwarding until stopped.

    ``run()`` is the background loop (poll every ``poll_interval_seconds`` or on
    ``wake()``, back off up to ``max_backoff_seconds`` after a failure);
    ``process_pending()`` does one pass. ``lease_seconds`` is how long a lease row
    (SQLite) outlives a process that stopped renewing it; ``in_flight_seconds`` how long
    a window's claims stay its own (longer than its sends take: each waits for the
    broker's confirm), after which a process that died mid-window has its window sent
    again. Raises ``ValueError`` for a non-positive ``poll_interval_seconds`` or
    ``max_backoff_seconds``.
    """

    def __init__(
        self,
        settings: Settings,
        engine: sa.Engine,
        transport: Transport,
        body_store: BodyStore,
        *,
        poll_interval_seconds: float = 1.0,
        lease_seconds: float = 30.0,
        in_flight_seconds: float = 60.0,
        max_backoff_seconds: float = 30.0,
        clock: Clock = utc_now,
    ) -> None:
        self._settings = settings
        self._in_flight = timedelta(seconds=in_flight_seconds)
        self._engine = engine
        self._transport = transport
        self._body_store = body_store
        self._clock = clock
        owner = f"{uuid.uuid4()}"
        self._lease = provider_for(engine).make_lease(engine, LEASE_NAME, owner, lease_seconds)
        # No lease for the loop: each pass holds it (process_pending) and close() gives
        # it up once the loop, and so the pass it waits for, has ended.
        self._periodic = PeriodicTask(
            "retry processor",
            self._process_and_continue,
            interval=poll_interval_seconds,
            max_backoff=max_backoff_seconds,
        )

    # -- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        """Process pending batches until cancelled; failures are logged and retried
        (``runtime.periodic``). On cancellation the pass ends after its current window,
        then the lease is released; an unsent batch stays persisted for the next start."""
        try:
            await self._periodic.run()
        finally:
            await self.close()

    async def _process_and_continue(self) -> None:
        if await self.process_pending():
            self._periodic.wake()  # batches were found: look again without waiting

    def wake(self) -> None:
        """Look for new batches now rather than at the next poll. Thread-safe; a no-op
        when the loop is not running."""
        self._periodic.wake()

    async def close(self) -> None:
        """Give up the lease (another process may take over at once)."""
        try:
            await asyncio.shield(asyncio.to_thread(self._lease.release))
        except Exception:
            log.warning("could not release the retry processor lease", exc_info=True)

    async def process_pending(self) -> int:
        """Stage and forward every batch that is not done, oldest first.

        Returns the number of batches it took up (a batch whose last window another
        process still sends is finished by a later pass); 0 when another process holds the
        lease.
        Raises ``LeaseLost`` when the lease is lost midway, the transport's or store's
        error when a send or a write fails (the batch stays where it was).
        """
        if not await asyncio.to_thread(self._lease.hold):
            return 0
        await asyncio.to_thread(self._close_abandoned_preparations)
        batch_ids = await asyncio.to_thread(self._pending_batch_ids)
        first_error: Exception | None = None
        for batch_id in batch_ids:
            if self._periodic.stopping.is_set():
                break
            try:
                await self.process_batch(batch_id)
            except LeaseLost:
                raise
            except Exception as exc:  # this batch waits; the later ones still go out
                log.warning("retry batch %s not finished: %s", batch_id, exc)
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return len(batch_ids)

    async def process_batch(self, batch_id: str) -> None:
        """Take batch ``batch_id`` from wherever it is to ``done``."""
        await asyncio.to_thread(self._stage, batch_id)
        await self._forward(batch_id)

    # -- staging -------------------------------------------------------------------------
    def _pending_batch_ids(self) -> list[str]:
        live = [str(s) for s in (BatchStatus.MARKING, BatchStatus.STAGING, BatchStatus.FORWARDING)]
        with self._engine.connect() as conn:
            return list(
                conn.scalars(
                    sa.select(rb.id).where(rb.status.in_(live)).order_by(rb.started_at, rb.id)
                )
            )

    def _stage(self, batch_id: str) -> None:
        """Staging, one transaction (module docstring); nothing to do once forwarding. The
        batch moves to forwarding first, by one conditional update: of two processes
        staging it at once (the lease changing hands), the second finds it moved and
        stages nothing, so its dropped claims count once."""
        now = self._clock()
        with begin_write(self._engine) as conn:
            taken = conn.execute(
                sa.update(retry_batches)
                .where(
                    rb.id == batch_id,
                    rb.status.in_([str(BatchStatus.MARKING), str(BatchStatus.STAGING)]),
                )
                .values(status=str(BatchStatus.FORWARDING), last_modified=now)
            ).rowcount
            if not taken:
                return
            batch = conn.execute(sa.select(rb.request_id).where(rb.id == batch_id)).one()
            rows = conn.execute(
                sa.select(fmr.failed_message_id, fm.status, fm.headers_json, fm.queue_address)
                .select_from(
                    failed_message_retries.outerjoin(
                        failed_messages, fm.id == fmr.failed_message_id
                    )
                )
                .where(fmr.retry_batch_id == batch_id)
                .order_by(fmr.failed_message_id)
            ).all()
            waiting = int(FailedMessageStatus.RETRY_ISSUED)
            dropped = [row.failed_message_id for row in rows if row.status != waiting]
            # A redirect in force when the batch is staged decides the target.
            targets = redirect_targets(conn, [r.queue_address for r in rows if r.queue_address])
            staged = [
                {
                    "b_id": row.failed_message_id,
                    "b_attempt": str(uuid.uuid4()),
                    "b_destination": targets.get(row.queue_address, row.queue_address),
                }
                for row in rows
                if row.status == waiting
            ]
            _delete_claims(conn, batch_id, dropped)
            if staged:
                conn.execute(
                    sa.update(failed_message_retries)
                    .where(
                        fmr.failed_message_id == sa.bindparam("b_id"),
                        fmr.retry_batch_id == batch_id,
                    )
                    .values(
                        attempt_message_id=sa.bindparam("b_attempt"),
                        destination=sa.bindparam("b_destination"),
                    ),
                    staged,
                )
            _count(conn, batch.request_id, now, skipped=len(dropped))
        RETRIED.labels("dropped").inc(len(dropped))
        log.info(
            "retry batch %s of retry operation %s staged: %d to send, %d dropped",
            batch_id,
            batch.request_id,
            len(staged),
            len(dropped),
        )

    # -- forwarding ----------------------------------------------------------------------
    async def _forward(self, batch_id: str) -> None:
        """Send the batch's claims a window at a time; when the loop is stopping, stop
        after the current window (the rest stays unsent, for the next start)."""
        while not self._periodic.stopping.is_set():
            if not await asyncio.to_thread(self._lease.hold):
                raise LeaseLost(f"lost the lease {LEASE_NAME!r} while forwarding {batch_id}")
            claims = await asyncio.to_thread(self._take_window, batch_id)
            if not claims:
                if not await asyncio.to_thread(self._unsent_left, batch_id):
                    await asyncio.to_thread(self._finish_batch, batch_id)
                return  # else another process's window is in flight: a later pass finishes
            window = await self._send_window(claims)
            if window.error is not None:
                window.counts = await self._broker_reachable()
            given_up = await asyncio.to_thread(self._record_window, batch_id, window)
            if window.error is not None and set(window.failed) != set(given_up):
                raise window.error

    async def _broker_reachable(self) -> bool:
        """True when the transport is connected: a failed send is then the destination's
        refusal, which counts against the claim, not an outage, which does not."""
        try:
            await self._transport.check()
        except Exception:
            return False
        return True

    def _take_window(self, batch_id: str) -> list[_Claim]:
        """Up to ``FORWARD_WINDOW`` unsent claims of the batch that no window in flight
        holds, marked in flight until ``in_flight_seconds`` from now in one transaction
        that locks them (``Provider.lock_for_claim``; one writer at a time on SQLite): of
        two processes that read the same claims, only one takes each."""
        now = self._clock()
        free = (
            sa.select(fmr.failed_message_id)
            .where(
                fmr.retry_batch_id == batch_id,
                fmr.sent_at.is_(None),
                sa.or_(fmr.in_flight_until.is_(None), fmr.in_flight_until <= now),
            )
            .order_by(fmr.failed_message_id)
            .limit(FORWARD_WINDOW)
        )
        with begin_write(self._engine) as conn:
            taken = list(conn.scalars(provider_for(self._engine).lock_for_claim(free)))
            if taken:
                conn.execute(
                    sa.update(failed_message_retries)
                    .where(fmr.retry_batch_id == batch_id, fmr.failed_message_id.in_(taken))
                    .values(in_flight_until=now + self._in_flight)
                )
        return self._claims(batch_id, taken)

    def _unsent_left(self, batch_id: str) -> bool:
        """Whether the batch has a claim not sent yet (in flight or not)."""
        with self._engine.connect() as conn:
            unsent = sa.select(fmr.failed_message_id).where(
                fmr.retry_batch_id == batch_id, fmr.sent_at.is_(None)
            )
            return conn.execute(unsent.limit(1)).first() is not None

    def _claims(self, batch_id: str, ids: Sequence[str]) -> list[_Claim]:
        """The claims ``ids`` of the batch with what sending each needs, by id."""
        if not ids:
            return []
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(
                    fmr.failed_message_id,
                    fmr.attempt_message_id,
                    fmr.destination,
                    fm.status,
                    fm.headers_json,
                    fm.content_type,
                    fm.body_text,
                    fm.body_stored_externally,
                    fm.body_key,
                )
                .select_from(
                    failed_message_retries.outerjoin(
                        failed_messages, fm.id == fmr.failed_message_id
                    )
                )
                .where(fmr.retry_batch_id == batch_id, fmr.failed_message_id.in_(list(ids)))
                .order_by(fmr.failed_message_id)
            ).all()
        return [_Claim(**row._mapping) for row in rows]

    async def _send_window(self, claims: Sequence[_Claim]) -> _Window:
        window = _Window(sent=[], dropped=[], unsendable={}, failed=[])
        outcomes = await asyncio.gather(
            *(self._send(claim) for claim in claims), return_exceptions=True
        )
        for claim, outcome in zip(claims, outcomes, strict=True):
            message_id = claim.failed_message_id
            if outcome is True:
                window.sent.append(message_id)
            elif outcome is False:
                window.dropped.append(message_id)
            elif isinstance(outcome, UnsendableMessage):
                window.unsendable[message_id] = outcome
            elif isinstance(outcome, BaseException):
                window.failed.append(message_id)
                window.error = window.error or outcome
        return window

    async def _send(self, claim: _Claim) -> bool:
        """Send one claim's message; ``True`` once the transport confirmed it, ``False``
        when the message is no longer RetryIssued (not sent).

        Raises ``UnsendableMessage`` for a fault of the message, the transport's or body
        store's error otherwise.
        """
        if claim.status != int(FailedMessageStatus.RETRY_ISSUED):
            return False
        stored = _stored_headers(claim.headers_json)
        if not claim.destination:
            raise UnsendableMessage(
                "the message names no queue to send it to", "no queue to send it to"
            )
        address, target_header = retry_wire.retry_route(stored, claim.destination)
        queue = retry_wire.queue_of_address(address)
        body = await asyncio.to_thread(self._read_body, claim)
        retry_wire.check_body_kept(stored, body)
        headers = retry_wire.retry_headers(
            stored,
            unique_message_id=claim.failed_message_id,
            acknowledgement_queue=self._settings.error_queue,
            target_endpoint_address=target_header,
        )
        outgoing = retry_wire.outgoing_message(headers, content_type=claim.content_type)
        try:
            await self._transport.publish(
                queue,
                outgoing.headers,
                body,
                message_id=outgoing.message_id,
                content_type=outgoing.content_type,
                properties=outgoing.properties,
            )
        except ValueError as exc:  # a header the transport cannot carry
            raise UnsendableMessage(
                f"the transport refused the message: {exc}", "the transport refused it"
            ) from exc
        return True

    def _read_body(self, claim: _Claim) -> bytes:
        """The exact body: the body store's copy when stored externally (authoritative,
        docs/design.md "Body placement"), else the inline text as UTF-8 (the bytes it was
        decoded from, strictly), else empty."""
        if claim.body_stored_externally:
            if claim.body_key is None:
                raise UnsendableMessage(
                    "the body is stored externally but has no key", _BODY_MISSING
                )
            try:
                return self._body_store.get(claim.body_key)
            except BodyNotFoundError as exc:
                raise UnsendableMessage(
                    f"the body is missing from the body store: {exc}", _BODY_MISSING
                ) from exc
        return (claim.body_text or "").encode("utf-8")

    def _record_window(self, batch_id: str, window: _Window) -> list[str]:
        """Write a window's outcome in one transaction: sent marks, removed claims,
        unsendable messages back to Unresolved, attempt counts of failed sends, claims
        given up (returned, sorted)."""
        now = self._clock()
        with begin_write(self._engine) as conn:
            request_id = conn.execute(
                sa.select(rb.request_id).where(rb.id == batch_id)
            ).scalar_one()
            forwarded = _mark_sent(conn, batch_id, window.sent, now) if window.sent else 0
            if window.failed:  # free at once for the next try, not when the mark passes
                conn.execute(
                    sa.update(failed_message_retries)
                    .where(fmr.retry_batch_id == batch_id, fmr.failed_message_id.in_(window.failed))
                    .values(in_flight_until=None)
                )
            unsendable = sorted(window.unsendable)
            _delete_claims(conn, batch_id, [*window.dropped, *unsendable])
            if unsendable:
                conn.execute(
                    sa.update(failed_messages)
                    .where(
                        fm.id.in_(unsendable), fm.status == int(FailedMessageStatus.RETRY_ISSUED)
                    )
                    .values(
                        status=int(FailedMessageStatus.UNRESOLVED),
                        status_changed_at=now,
                        last_modified=now,
                    )
                )
                self._refuse(conn, batch_id, request_id, window.unsendable, now)
            given_up: list[str] = []
            if window.failed and window.counts:
                conn.execute(
                    sa.update(failed_message_retries)
                    .where(fmr.retry_batch_id == batch_id, fmr.failed_message_id.in_(window.failed))
                    .values(stage_attempts=fmr.stage_attempts + 1)
                )
                given_up = self._give_up(conn, batch_id, request_id, window, now)
            _count(
                conn,
                request_id,
                now,
                forwarded=forwarded,
                # Skipped: nothing to send any more (resolved, archived meanwhile). What
                # cannot be sent counts in neither: the message count less the two.
                skipped=len(window.dropped),
                failed=bool(unsendable) or bool(given_up),
            )
        for message_id, refusal in window.unsendable.items():
            log.warning("failed message %s cannot be retried: %s", message_id, refusal.reason)
        RETRIED.labels("sent").inc(len(window.sent))
        RETRIED.labels("dropped").inc(len(window.dropped))
        RETRIED.labels("unsendable").inc(len(unsendable))
        return given_up

    def _refuse(
        self,
        conn: sa.Connection,
        batch_id: str,
        request_id: str,
        unsendable: dict[str, UnsendableMessage],
        now: datetime,
    ) -> None:
        """Record why messages of a window cannot be sent: the operation's
        ``failure_reason`` (the first, unless it has one) names the message and quotes the
        reason; the event log names the ids and what is wrong without quoting them
        (docs/decisions.md "Event log items quote ids and counts, never content")."""
        ids = sorted(unsendable)
        first = unsendable[ids[0]]
        more = f" (and {len(ids) - 1} more)" if len(ids) > 1 else ""
        reason = f"failed message {ids[0]} cannot be sent: {first.reason}{more}"[:1000]
        conn.execute(
            sa.update(retry_operations)
            .where(ro.id == request_id, ro.failure_reason.is_(None))
            .values(failure_reason=reason)
        )
        summaries = sorted({unsendable[i].summary for i in ids})
        activity.retry_refused(conn, request_id, batch_id, ids, summaries, now=now)

    def _give_up(
        self,
        conn: sa.Connection,
        batch_id: str,
        request_id: str,
        window: _Window,
        now: datetime,
    ) -> list[str]:
        """Give up the failed claims of ``window`` that reached ``MAX_SEND_ATTEMPTS``: the
        claims go, their messages are Unresolved again, the operation records the reason
        and the event log says so. Returns the ids given up, sorted."""
        given_up = sorted(
            conn.scalars(
                sa.select(fmr.failed_message_id).where(
                    fmr.retry_batch_id == batch_id,
                    fmr.failed_message_id.in_(window.failed),
                    fmr.stage_attempts >= MAX_SEND_ATTEMPTS,
                )
            )
        )
        if not given_up:
            return []
        reason = f"{type(window.error).__name__}: {window.error}"[:1000]
        _delete_claims(conn, batch_id, given_up)
        conn.execute(
            sa.update(failed_messages)
            .where(fm.id.in_(given_up), fm.status == int(FailedMessageStatus.RETRY_ISSUED))
            .values(
                status=int(FailedMessageStatus.UNRESOLVED), status_changed_at=now, last_modified=now
            )
        )
        conn.execute(
            sa.update(retry_operations).where(ro.id == request_id).values(failure_reason=reason)
        )
        activity.retry_given_up(
            conn, request_id, batch_id, given_up, reason, attempts=MAX_SEND_ATTEMPTS, now=now
        )
        log.error(
            "retry batch %s gave up on %d messages after %d failed sends: %s",
            batch_id,
            len(given_up),
            MAX_SEND_ATTEMPTS,
            reason,
        )
        RETRIED.labels("given_up").inc(len(given_up))
        return given_up

    def _finish_batch(self, batch_id: str) -> None:
        now = self._clock()
        with begin_write(self._engine) as conn:
            request_id = conn.execute(
                sa.select(rb.request_id).where(rb.id == batch_id)
            ).scalar_one()
            conn.execute(
                sa.update(retry_batches)
                .where(rb.id == batch_id, rb.status == str(BatchStatus.FORWARDING))
                .values(status=str(BatchStatus.DONE), completed_at=now, last_modified=now)
            )
            complete_operation_if_finished(conn, request_id, now)
        log.info("retry batch %s forwarded", batch_id)

    def _close_abandoned_preparations(self) -> None:
        """Close operations whose request died before it created all its batches
        (``requests.close_abandoned_preparations``)."""
        with begin_write(self._engine) as conn:
            close_abandoned_preparations(conn, self._clock())


# --- helpers ------------------------------------------------------------------------------
def _stored_headers(headers_json: str | None) -> dict[str, str | None]:
    """The stored headers; raises ``UnsendableMessage`` unless they are a JSON object of
    strings (or nulls)."""
    try:
        value: Any = json.loads(headers_json or "")
    except ValueError as exc:
        raise UnsendableMessage(
            f"the stored headers are not JSON: {exc}", _HEADERS_UNREADABLE
        ) from exc
    if not isinstance(value, dict) or not all(
        isinstance(item, str | None) for item in value.values()
    ):
        raise UnsendableMessage(
            "the stored headers are not an object of strings", _HEADERS_UNREADABLE
        )
    return value


def _mark_sent(conn: sa.Connection, batch_id: str, sent: Sequence[str], now: datetime) -> int:
    """Mark the claims of ``sent`` (messages this window sent) sent at ``now``; answers how
    many it marked, which count as forwarded here. A claim another process sent too (its
    mark past) is marked already and counts once, there. A claim that is gone was removed
    by its message's confirmation (an endpoint that handled the retry before this window
    was written), and the writer that removed it counted it (``errors.ingest.writer``)."""
    return conn.execute(
        sa.update(failed_message_retries)
        .where(
            fmr.retry_batch_id == batch_id,
            fmr.failed_message_id.in_(sent),
            fmr.sent_at.is_(None),
        )
        .values(sent_at=now)
    ).rowcount


def _delete_claims(conn: sa.Connection, batch_id: str, ids: Sequence[str]) -> None:
    for start in range(0, len(ids), 500):
        conn.execute(
            sa.delete(failed_message_retries).where(
                fmr.retry_batch_id == batch_id,
                fmr.failed_message_id.in_(list(ids[start : start + 500])),
            )
        )


def _count(
    conn: sa.Connection,
    operation_id: str,
    now: datetime,
    *,
    forwarded: int = 0,
    skipped: int = 0,
    failed: bool = False,
) -> None:
    values: dict[str, Any] = {
        "forwarded_count": ro.forwarded_count + forwarded,
        "skipped_count": ro.skipped_count + skipped,
        # While its request still makes batches, last_modified is the request's own: it
        # tells a live request from one that ended (requests.ABANDONED_PREPARATION).
        "last_modified": sa.case((ro.prepared_at.is_(None), ro.last_modified), else_=now),
    }
    if failed:
        values["failed"] = True
    conn.execute(sa.update(retry_operations).where(ro.id == operation_id).values(values))
