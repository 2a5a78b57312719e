"""Retry requests: from an operator's selection to claimed retry batches, and their history.

Source: docs/design.md "Error instance: retries"; docs/decisions.md "Retry requests claim
messages in batches"; ServiceControl's ``RetriesGateway``.

A retry request (one ``retry_operations`` row) becomes ``retry_batches`` of at most
``BATCH_SIZE`` messages. Each batch is written in one transaction that

1. creates the batch (status ``marking``),
2. claims its messages in ``failed_message_retries`` with a set-based insert-if-absent
   (``claims``): a message already claimed by another batch is skipped, so a
   message is in at most one batch at a time even when two operators retry overlapping
   sets at once,
3. marks exactly the messages this batch claimed RetryIssued and keeps their ids as the
   operation's (``retry_operation_messages``, which its outcome counts),
4. moves the batch to ``staging``, where the retry processor
   (``controlroom.errors.retries.processor``) takes it up.

A crash anywhere in that transaction rolls all of it back: no claim without its batch, no
RetryIssued without its claim.

Lifetime of a claim: from the batch that made it until the retry is confirmed (the
writer's step 4 deletes it) or the operator retries a pending retry. A claim whose batch
is ``done`` while its message is no longer RetryIssued (it failed again, was archived or
resolved) is *stale*: the next claim of that message replaces it. So a retried message
that fails again can be retried again, and a message is never sent by two live batches.

Every request takes ``by``, the name of the principal who asked (the API's and the
console's alike, docs/decisions.md "The console calls the same functions as the API"):
the event log's ``RetryOperationRequested`` item names it.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
import tenacity

from controlroom.db.engine import begin_write
from controlroom.db.errors import is_transient
from controlroom.db.providers import chunked, provider_for
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_groups,
    failed_message_retries,
    failed_messages,
    retry_batches,
    retry_operation_messages,
    retry_operations,
)
from controlroom.errors import activity
from controlroom.errors.ingest.headers import parse_guid
from controlroom.errors.read.filters import failed_in_queue
from controlroom.errors.read.redirects import redirect_targets
from controlroom.errors.retries import wire as retry_wire
from controlroom.errors.retries.claims import claim_messages
from controlroom.exceptions import ControlroomError
from controlroom.runtime.clock import Clock, utc_now
from controlroom.transport.base import Transport

fm = failed_messages.c
fmr = failed_message_retries.c
rb = retry_batches.c
ro = retry_operations.c

log = logging.getLogger(__name__)

BATCH_SIZE = 1000
"""Most messages in one retry batch (ServiceControl's ``RetriesGateway.BatchSize``)."""

ANSWER_WITHIN = 4.0
"""Seconds the API and the console give a retry of a selection (a group, a queue, an
endpoint, all) to make its batches before they answer; the rest are made after the
answer (``retry_all``'s ``answer_within``): a storm's group of 65,000 took 79 s. Below
the 5 s the README states: a batch's time is foreseen from the last one's, not known."""

ABANDONED_PREPARATION = timedelta(minutes=1)
"""A request that has not claimed a chunk of its messages for this long died with its
process (each chunk's transaction, claimed or not, takes well under it): its operation
is not running any more, and is closed with the batches it has, by the next request of
the same selection or by the retry processor (docs/decisions.md "Retry requests claim
messages in batches")."""

HISTORY_DEPTH = 10
"""Completed operations listed in the history (ServiceControl's default history depth)."""


class RetryType(enum.StrEnum):
    """What a retry operation selected (ServiceControl's ``RetryType`` names)."""

    SINGLE_MESSAGE = "SingleMessage"
    FAILURE_GROUP = "FailureGroup"
    MULTIPLE_MESSAGES = "MultipleMessages"
    ALL_FOR_ENDPOINT = "AllForEndpoint"
    ALL = "All"
    BY_QUEUE_ADDRESS = "ByQueueAddress"


class BatchStatus(enum.StrEnum):
    """The persisted stage of a retry batch; the processor resumes from it after a restart.

    ``marking``: claims being written (never committed: the creating transaction leaves
    it); ``staging``: claimed, waiting to be staged; ``forwarding``: staged (each claim has
    its attempt id and destination), being sent; ``done``: every claim sent or dropped.
    """

    MARKING = "marking"
    STAGING = "staging"
    FORWARDING = "forwarding"
    DONE = "done"


# --- errors -------------------------------------------------------------------------------
class RetryRequestError(ControlroomError):
    """A retry request that cannot be carried out as asked; nothing was changed."""


class UnknownFailedMessages(RetryRequestError):
    """Some requested ids name no failed message (``ids``, as given)."""

    def __init__(self, ids: Sequence[str]) -> None:
        self.ids = list(ids)
        super().__init__(f"no failed message with id {', '.join(self.ids[:20])}")


class NotRetryable(RetryRequestError):
    """Some requested messages are in a status that cannot be retried (archived, resolved).

    ``statuses`` maps each such id to its status.
    """

    def __init__(self, statuses: dict[str, FailedMessageStatus]) -> None:
        self.statuses = statuses
        described = ", ".join(
            f"{message_id} is {status.name.lower()}"
            for message_id, status in list(statuses.items())[:20]
        )
        hints = {
            FailedMessageStatus.ARCHIVED: "unarchive an archived message before retrying it",
            FailedMessageStatus.RESOLVED: "a resolved message has nothing left to retry",
        }
        said = [hint for status, hint in hints.items() if status in statuses.values()]
        super().__init__("; ".join([f"cannot retry: {described}", *said]))


class UnknownGroup(RetryRequestError):
    """No failed message belongs to the requested group."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        super().__init__(f"no failure group with id {group_id}")


# --- results ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RetryBatchInfo:
    """One batch a request created: its id, how many messages it claimed, its status."""

    id: str
    message_count: int
    status: BatchStatus


@dataclass(frozen=True, slots=True)
class RetryRequestResult:
    """What a retry request did.

    ``batches`` are the batches it created (none when every selected message was already
    in a retry, or ``already_running``); ``skipped_count`` counts selected messages
    another batch holds.
    """

    operation_id: str
    retry_type: RetryType
    target: str | None
    batches: list[RetryBatchInfo] = field(default_factory=list)
    skipped_count: int = 0
    already_running: bool = False
    """An operation of the same selection was in progress: this request started none,
    and ``operation_id`` is that one's (ServiceControl's ``RetryAllInGroup``)."""
    preparing: bool = False
    """The request answered before it created all its batches (``answer_within``): it goes
    on in the background, and its operation is prepared once they are all made."""

    @property
    def message_count(self) -> int:
        return sum(batch.message_count for batch in self.batches)


@dataclass(frozen=True, slots=True)
class _Selection:
    """What a request retries. ``condition`` filters ``failed_messages`` (query-based
    requests); ``ids`` lists the messages (id-based requests)."""

    retry_type: RetryType
    target: str | None = None
    originator: str | None = None
    classifier: str | None = None
    condition: sa.ColumnElement[bool] | None = None
    ids: tuple[str, ...] = ()
    release_pending: bool = False  # pending retries: take over claims of done batches


# --- public requests ----------------------------------------------------------------------
def retry_message(
    engine: sa.Engine, failed_message_id: str, *, by: str | None = None, clock: Clock = utc_now
) -> RetryRequestResult:
    """Retry one failed message (``SingleMessage``).

    Raises ``UnknownFailedMessages`` when the id names no message, ``NotRetryable`` when
    it is archived or resolved. A message already in a retry is skipped, not an error.
    """
    ids = _validated_ids(engine, [failed_message_id])
    selection = _Selection(RetryType.SINGLE_MESSAGE, target=ids[0], ids=tuple(ids))
    return _run_request(engine, selection, clock, by)


def retry_messages(
    engine: sa.Engine,
    failed_message_ids: Sequence[str],
    *,
    by: str | None = None,
    clock: Clock = utc_now,
) -> RetryRequestResult:
    """Retry a selection of failed messages (``MultipleMessages``). Raises as ``retry_message``."""
    ids = _validated_ids(engine, failed_message_ids)
    selection = _Selection(RetryType.MULTIPLE_MESSAGES, ids=tuple(ids))
    return _run_request(engine, selection, clock, by)


def retry_pending_messages(
    engine: sa.Engine,
    failed_message_ids: Sequence[str],
    *,
    by: str | None = None,
    clock: Clock = utc_now,
) -> RetryRequestResult:
    """Retry messages again whose earlier retry was sent but never confirmed.

    Claims of ``done`` batches on these messages are released first (ServiceControl's
    ``PendingRetriesHandler`` deletes the retry documents), then they are retried as a
    selection. A message whose batch is still being sent stays with that batch.
    Raises as ``retry_message``.
    """
    ids = _validated_ids(engine, failed_message_ids)
    selection = _Selection(RetryType.MULTIPLE_MESSAGES, ids=tuple(ids), release_pending=True)
    return _run_request(engine, selection, clock, by)


def retry_group(
    engine: sa.Engine,
    group_id: str,
    *,
    by: str | None = None,
    clock: Clock = utc_now,
    answer_within: float | None = None,
    on_batches: Callable[[], None] | None = None,
) -> RetryRequestResult:
    """Retry the Unresolved messages of failure group ``group_id`` (``FailureGroup``);
    ``answer_within`` and ``on_batches`` as ``retry_all``'s.

    Raises ``UnknownGroup`` when no message belongs to the group.
    """
    fmg = failed_message_groups.c
    with engine.connect() as conn:
        group = conn.execute(
            sa.select(fmg.classifier, fmg.title).where(fmg.group_id == group_id).limit(1)
        ).one_or_none()
    if group is None:
        raise UnknownGroup(group_id)
    members = sa.select(fmg.failed_message_id).where(fmg.group_id == group_id)
    selection = _Selection(
        RetryType.FAILURE_GROUP,
        target=group_id,
        originator=group.title,
        classifier=group.classifier,
        condition=fm.id.in_(members),
    )
    return _run_request(engine, selection, clock, by, answer_within, on_batches)


def retry_queue(
    engine: sa.Engine,
    queue_address: str,
    *,
    by: str | None = None,
    clock: Clock = utc_now,
    answer_within: float | None = None,
    on_batches: Callable[[], None] | None = None,
) -> RetryRequestResult:
    """Retry the Unresolved messages that failed in ``queue_address`` (``ByQueueAddress``);
    ``answer_within`` and ``on_batches`` as ``retry_all``'s."""
    selection = _Selection(
        RetryType.BY_QUEUE_ADDRESS,
        target=queue_address,
        originator=queue_address,
        condition=failed_in_queue(queue_address),
    )
    return _run_request(engine, selection, clock, by, answer_within, on_batches)


def retry_endpoint(
    engine: sa.Engine,
    endpoint_name: str,
    *,
    by: str | None = None,
    clock: Clock = utc_now,
    answer_within: float | None = None,
    on_batches: Callable[[], None] | None = None,
) -> RetryRequestResult:
    """Retry the Unresolved messages of the receiving endpoint ``endpoint_name``
    (``AllForEndpoint``); ``answer_within`` and ``on_batches`` as ``retry_all``'s."""
    selection = _Selection(
        RetryType.ALL_FOR_ENDPOINT,
        target=endpoint_name,
        originator=endpoint_name,
        condition=fm.receiving_endpoint == endpoint_name,
    )
    return _run_request(engine, selection, clock, by, answer_within, on_batches)


def retry_all(
    engine: sa.Engine,
    *,
    by: str | None = None,
    clock: Clock = utc_now,
    answer_within: float | None = None,
    on_batches: Callable[[], None] | None = None,
) -> RetryRequestResult:
    """Retry every Unresolved message (``All``).

    ``answer_within`` (seconds): when the next batch, taking as long as the last, would
    end past it, answer with the batches made so far (``preparing``; at least one) and
    make the rest in a thread of their own, calling ``on_batches`` when done (a
    processor's wake-up); ``None``: make every batch first.
    """
    selection = _Selection(RetryType.ALL, condition=sa.true())
    return _run_request(engine, selection, clock, by, answer_within, on_batches)


# --- validation ---------------------------------------------------------------------------
RETRYABLE = (FailedMessageStatus.UNRESOLVED, FailedMessageStatus.RETRY_ISSUED)
"""Statuses a message selected by id may be retried from (claims decide the rest)."""


def _validated_ids(engine: sa.Engine, requested: Sequence[str]) -> list[str]:
    """The requested ids in canonical form, sorted, without duplicates.

    Raises ``UnknownFailedMessages`` for ids that are not GUIDs or name no message,
    ``NotRetryable`` for messages that are archived or resolved.
    """
    canonical = {raw: parse_guid(raw) for raw in requested}
    ids = sorted({value for value in canonical.values() if value is not None})
    statuses: dict[str, FailedMessageStatus] = {}
    with engine.connect() as conn:
        for chunk in chunked(ids, provider_for(conn).max_ids_per_in_list):
            rows = conn.execute(sa.select(fm.id, fm.status).where(fm.id.in_(chunk)))
            statuses.update({row.id: FailedMessageStatus(row.status) for row in rows})
    unknown = [raw for raw, value in canonical.items() if value not in statuses]
    if unknown:
        raise UnknownFailedMessages(unknown)
    refused = {i: s for i, s in statuses.items() if s not in RETRYABLE}
    if refused:
        raise NotRetryable(refused)
    return ids


# --- the request --------------------------------------------------------------------------
def _run_request(
    engine: sa.Engine,
    selection: _Selection,
    clock: Clock,
    by: str | None,
    answer_within: float | None = None,
    on_batches: Callable[[], None] | None = None,
) -> RetryRequestResult:
    """Record the operation, create its batches one transaction each, then mark it
    prepared (or forget it when it claimed nothing), logging the request by ``by``; past
    ``answer_within`` the rest goes on in a thread (``retry_all``)."""
    operation_id = str(uuid.uuid4())
    retrying = _retrying()
    running = retrying(_start_operation, engine, selection, operation_id, clock)
    if running is not None:
        return RetryRequestResult(
            running, selection.retry_type, selection.target, already_running=True
        )
    batches: list[RetryBatchInfo] = []
    skipped = 0
    answer_by = None if answer_within is None else time.monotonic() + answer_within
    chunks = _candidate_chunks(engine, selection)
    for candidates in chunks:
        began = time.monotonic()
        try:
            batch, not_claimed = retrying(
                _claim_batch, engine, selection, operation_id, candidates, clock
            )
        except OperationClosed:
            _say_closed(operation_id)
            return RetryRequestResult(
                operation_id, selection.retry_type, selection.target, batches, skipped
            )
        skipped += not_claimed
        if batch is not None:
            batches.append(batch)
        ended = time.monotonic()
        # Answer before a batch that would end past the time, as long as the last one took.
        if answer_by is not None and ended + (ended - began) >= answer_by:
            threading.Thread(
                target=_prepare_the_rest,
                args=(engine, selection, operation_id, chunks, clock, by, on_batches),
                name=f"retry-preparation-{operation_id[:8]}",
                daemon=True,  # a process that ends leaves the operation to be closed
            ).start()
            return RetryRequestResult(
                operation_id,
                selection.retry_type,
                selection.target,
                batches,
                skipped,
                preparing=True,
            )
    retrying(_finish_preparing, engine, operation_id, clock, by)
    return RetryRequestResult(
        operation_id, selection.retry_type, selection.target, batches, skipped
    )


def _say_closed(operation_id: str) -> None:
    log.warning(
        "retry operation %s was closed while its request made its batches (no progress for "
        "%s): the request stops; the messages it did not claim wait for the next retry",
        operation_id,
        ABANDONED_PREPARATION,
    )


def _prepare_the_rest(
    engine: sa.Engine,
    selection: _Selection,
    operation_id: str,
    chunks: Iterator[Sequence[str]],
    clock: Clock,
    by: str | None,
    on_batches: Callable[[], None] | None,
) -> None:
    """The batches of a request that answered before it made them all, then its
    operation prepared. A failure is logged; the operation, no longer making progress, is
    closed with the batches it has (``ABANDONED_PREPARATION``)."""
    retrying = _retrying()
    try:
        for candidates in chunks:
            retrying(_claim_batch, engine, selection, operation_id, candidates, clock)
        retrying(_finish_preparing, engine, operation_id, clock, by)
    except OperationClosed:
        _say_closed(operation_id)
        return
    except Exception:
        log.exception(
            "retry operation %s: creating its batches failed; it is closed with the batches "
            "it has within %s",
            operation_id,
            ABANDONED_PREPARATION,
        )
        return
    if on_batches is not None:
        on_batches()


def _candidate_chunks(engine: sa.Engine, selection: _Selection) -> Iterator[Sequence[str]]:
    """Candidate ids, sorted, at most ``BATCH_SIZE`` per chunk.

    Id-based: the given ids. Query-based: the Unresolved messages matching the condition,
    read chunk by chunk with a keyset cursor on the id, so messages that fail while the
    request runs are picked up and nothing is read twice.
    """
    if selection.condition is None:
        yield from chunked(list(selection.ids), BATCH_SIZE)
        return
    after = ""
    while True:
        with engine.connect() as conn:
            ids = list(
                conn.scalars(
                    sa.select(fm.id)
                    .where(
                        fm.status == int(FailedMessageStatus.UNRESOLVED),
                        selection.condition,
                        fm.id > after,
                    )
                    .order_by(fm.id)
                    .limit(BATCH_SIZE)
                )
            )
        if not ids:
            return
        yield ids
        after = ids[-1]


def _claim_batch(
    engine: sa.Engine,
    selection: _Selection,
    operation_id: str,
    candidates: Sequence[str],
    clock: Clock,
) -> tuple[RetryBatchInfo | None, int]:
    """One batch in one transaction: create it, claim, mark RetryIssued, move to staging.

    Only the messages this batch claimed change status, and only from a retryable status
    (a message archived meanwhile keeps its status; staging then drops its claim).
    """
    now = clock()
    batch_id = str(uuid.uuid4())
    with begin_write(engine) as conn:
        _release_claims(conn, candidates, pending_too=selection.release_pending)
        conn.execute(
            sa.insert(retry_batches).values(
                id=batch_id,
                request_id=operation_id,
                retry_type=str(selection.retry_type),
                status=str(BatchStatus.MARKING),
                originator=selection.originator,
                classifier=selection.classifier,
                initial_batch_size=0,
                started_at=now,
                last_modified=now,
            )
        )
        claimed = claim_messages(conn, batch_id, candidates)
        if not claimed:
            conn.execute(sa.delete(retry_batches).where(rb.id == batch_id))
            _still_preparing(conn, operation_id, now)  # progress all the same: it is alive
            return None, len(candidates)
        _mark_retry_issued(conn, claimed, now)
        _keep_claimed(conn, operation_id, batch_id)
        conn.execute(
            sa.update(retry_batches)
            .where(rb.id == batch_id)
            .values(status=str(BatchStatus.STAGING), initial_batch_size=len(claimed))
        )
        _still_preparing(conn, operation_id, now, claimed=len(claimed))
    batch = RetryBatchInfo(batch_id, len(claimed), BatchStatus.STAGING)
    return batch, len(candidates) - len(claimed)


class OperationClosed(ControlroomError):
    """The operation a request makes batches for was closed meanwhile: the request had
    made no progress for ``ABANDONED_PREPARATION`` (held on a lock), and the next request
    or the retry processor took it for ended (``close_abandoned_preparations``)."""


def _still_preparing(
    conn: sa.Connection, operation_id: str, now: datetime, *, claimed: int = 0
) -> None:
    """Count ``claimed`` more messages in the operation and mark the request's progress;
    raises ``OperationClosed`` (the transaction rolls back: no batch, no claim) when the
    operation is prepared already, closed as abandoned."""
    still = conn.execute(
        sa.update(retry_operations)
        .where(ro.id == operation_id, ro.prepared_at.is_(None))
        .values(message_count=ro.message_count + claimed, last_modified=now)
    ).rowcount
    if not still:
        raise OperationClosed(f"retry operation {operation_id} was closed meanwhile")


def _release_claims(conn: sa.Connection, ids: Sequence[str], *, pending_too: bool) -> None:
    """Delete the claims of ``done`` batches on ``ids`` that no longer hold a message back:
    stale ones (the message is not RetryIssued), and with ``pending_too`` also pending
    ones (sent, never confirmed). Claims of live batches are never touched."""
    done_batches = sa.select(rb.id).where(rb.status == str(BatchStatus.DONE))
    conditions = [fmr.failed_message_id.in_(ids), fmr.retry_batch_id.in_(done_batches)]
    if not pending_too:
        not_waiting = sa.select(fm.id).where(fm.status != int(FailedMessageStatus.RETRY_ISSUED))
        conditions.append(fmr.failed_message_id.in_(not_waiting))
    conn.execute(sa.delete(failed_message_retries).where(*conditions))


def _keep_claimed(conn: sa.Connection, operation_id: str, batch_id: str) -> None:
    """Keep the ids batch ``batch_id`` claimed as the operation's, for its outcome
    (``outcomes``; docs/decisions.md "A retry's outcome counts the failures since"): one
    INSERT ... SELECT of the batch's claims, by their batch index."""
    claimed = sa.select(sa.literal(operation_id), fmr.failed_message_id).where(
        fmr.retry_batch_id == batch_id
    )
    conn.execute(
        sa.insert(retry_operation_messages).from_select(
            ["operation_id", "failed_message_id"], claimed
        )
    )


def _mark_retry_issued(conn: sa.Connection, claimed: Sequence[str], now: datetime) -> None:
    for chunk in chunked(list(claimed), provider_for(conn).max_ids_per_in_list):
        conn.execute(
            sa.update(failed_messages)
            .where(fm.id.in_(chunk), fm.status.in_([int(s) for s in RETRYABLE]))
            .values(
                status=int(FailedMessageStatus.RETRY_ISSUED),
                status_changed_at=now,
                last_modified=now,
            )
        )


def _start_operation(
    engine: sa.Engine, selection: _Selection, operation_id: str, clock: Clock
) -> str | None:
    """Record operation ``operation_id``, unless the selection is a query's (a group, a
    queue, an endpoint, all) and an operation of it is still in progress: then record
    none and answer that one's id. Two such requests at once are serialized
    (``Provider.lock_retry_selection``), so one of them starts."""
    now = clock()
    with begin_write(engine) as conn:
        if selection.condition is not None:
            provider_for(conn).lock_retry_selection(
                conn, f"{selection.retry_type}:{selection.target or ''}"
            )
            same = (
                ro.retry_type == str(selection.retry_type),
                ro.target.is_(None) if selection.target is None else ro.target == selection.target,
            )
            close_abandoned_preparations(conn, now, *same)
            running = conn.execute(
                sa.select(ro.id).where(*same, ro.completed_at.is_(None)).limit(1)
            ).scalar_one_or_none()
            if running is not None:
                return str(running)
        conn.execute(
            sa.insert(retry_operations).values(
                id=operation_id,
                retry_type=str(selection.retry_type),
                target=selection.target,
                originator=selection.originator,
                classifier=selection.classifier,
                message_count=0,
                forwarded_count=0,
                skipped_count=0,
                failed=False,
                acknowledged=False,
                started_at=now,
                last_modified=now,
            )
        )
    return None


def _finish_preparing(engine: sa.Engine, operation_id: str, clock: Clock, by: str | None) -> None:
    """Mark the operation prepared (``_prepare``)."""
    with begin_write(engine) as conn:
        _prepare(conn, operation_id, clock(), by=by)


def _prepare(
    conn: sa.Connection, operation_id: str, now: datetime, *, by: str | None, ended: bool = False
) -> None:
    """Mark the operation prepared and log its request, stamped when it was made (its
    ``started_at``); an operation that claimed nothing is not kept (there is nothing to
    report: ServiceControl starts no operation for zero messages). ``ended``: its request
    ended before it made all its batches."""
    unprepared = (ro.id == operation_id, ro.prepared_at.is_(None))  # not closed meanwhile
    conn.execute(sa.delete(retry_operations).where(*unprepared, ro.message_count == 0))
    prepare = (
        sa.update(retry_operations)
        .where(*unprepared)
        .values(prepared_at=now, last_modified=now)
    )
    updated = provider_for(conn).update_returning(
        conn, prepare, [ro.retry_type, ro.target, ro.message_count, ro.started_at]
    )
    prepared = updated[0] if updated else None  # by primary key: one row at most
    if prepared is not None:
        activity.retry_requested(
            conn,
            operation_id,
            prepared.retry_type,
            prepared.target,
            prepared.message_count,
            by=by,
            now=prepared.started_at,
            ended=ended,
        )
    complete_operation_if_finished(conn, operation_id, now)


def close_abandoned_preparations(
    conn: sa.Connection, now: datetime, *selection: sa.ColumnElement[bool]
) -> None:
    """Close the operations (of ``selection``'s, else any) whose request made no progress
    for ``ABANDONED_PREPARATION`` before it created all its batches, as ``_prepare`` does:
    prepared now, with the batches they have (one that has none is not kept), its request
    logged, and completed when those are done."""
    abandoned = conn.scalars(
        sa.select(ro.id).where(
            *selection,
            ro.prepared_at.is_(None),
            ro.last_modified < now - ABANDONED_PREPARATION,
        )
    ).all()
    for operation_id in abandoned:
        _prepare(conn, operation_id, now, by=None, ended=True)


def complete_operation_if_finished(conn: sa.Connection, operation_id: str, now: datetime) -> None:
    """Stamp ``completed_at`` once the operation is prepared and every batch is done, and
    log the outcome in the event log (in the same transaction)."""
    unfinished = sa.select(rb.id).where(
        rb.request_id == operation_id, rb.status != str(BatchStatus.DONE)
    )
    complete = (
        sa.update(retry_operations)
        .where(
            ro.id == operation_id,
            ro.prepared_at.is_not(None),
            ro.completed_at.is_(None),
            ~sa.exists(unfinished),
        )
        .values(completed_at=now, last_modified=now)
    )
    updated = provider_for(conn).update_returning(
        conn, complete, [ro.message_count, ro.forwarded_count, ro.skipped_count, ro.failed]
    )
    finished = updated[0] if updated else None  # by primary key: one row at most
    if finished is not None:
        activity.retry_finished(
            conn,
            operation_id,
            message_count=finished.message_count,
            forwarded=finished.forwarded_count,
            skipped=finished.skipped_count,
            failed=finished.failed,
            now=now,
        )


# --- edit and retry -----------------------------------------------------------------------
class MessageBeingRetried(RetryRequestError):
    """The message is in a retry (or another edit) right now."""

    def __init__(self, failed_message_id: str) -> None:
        self.failed_message_id = failed_message_id
        super().__init__(
            f"failed message {failed_message_id} is being retried; wait for the retry "
            "to finish (or fail) before editing it"
        )


class InvalidEdit(RetryRequestError):
    """The edit itself is refused: a locked header changed, or the body is empty."""


@dataclass(frozen=True, slots=True)
class EditResult:
    """An edited copy that was sent: ids and where it went."""

    failed_message_id: str  # the original, now Resolved
    edit_id: str  # ServiceControl.Retry.UniqueMessageId of the copy
    message_id: str  # NServiceBus.MessageId of the copy
    destination: str  # address


async def edit_and_retry(
    engine: sa.Engine,
    transport: Transport,
    failed_message_id: str,
    *,
    body: str,
    headers: Mapping[str, str | None],
    acknowledgement_queue: str,
    clock: Clock = utc_now,
) -> EditResult:
    """Send an edited copy of an Unresolved failed message, then resolve the original.

    The copy has ``body`` (as UTF-8) and ``headers`` minus the failure headers, a new
    ``NServiceBus.MessageId`` and ``ServiceControl.EditOf`` naming the original
    (``retry_wire.edited_message_headers``); it goes where a retry would go. A Python
    task's copy keeps the broker properties and typed headers of its
    ``Controlroom.TaskQueue.Properties`` (``retry_wire.outgoing_message``), the body
    edited. The original
    is RetryIssued while the copy is sent (so no retry or second edit takes it meanwhile),
    Resolved once the transport confirmed it, Unresolved again when the send failed.
    Source: docs/decisions.md "Edits lock the identity and retry headers"; ServiceControl's
    ``EditHandler``.

    Raises ``UnknownFailedMessages``, ``NotRetryable`` (archived, resolved),
    ``MessageBeingRetried``, ``InvalidEdit`` (locked header changed, empty body, no
    queue, or headers the transport cannot carry: its ``ValueError``), or the transport's
    error (the original is Unresolved again).
    """
    original_id = _canonical_id(failed_message_id)
    stored, target = await asyncio.to_thread(_stored_message, engine, original_id)
    _check_edit(stored, headers, body)
    destination, target_header = retry_wire.retry_route(headers, target)
    try:
        queue = retry_wire.queue_of_address(destination)
    except retry_wire.UnsendableMessage as exc:
        raise InvalidEdit(exc.reason) from None
    result = EditResult(original_id, str(uuid.uuid4()), str(uuid.uuid4()), destination)
    outgoing = retry_wire.edited_message_headers(
        headers,
        original_id=original_id,
        new_message_id=result.message_id,
        edit_id=result.edit_id,
        acknowledgement_queue=acknowledgement_queue,
        target_endpoint_address=target_header,
    )
    try:
        message = retry_wire.outgoing_message(outgoing)
    except retry_wire.UnsendableMessage as exc:
        raise InvalidEdit(f"message_headers: {exc.reason}") from None
    await asyncio.to_thread(_set_edit_state, engine, original_id, True, clock)
    try:
        await transport.publish(
            queue,
            message.headers,
            body.encode("utf-8"),
            message_id=message.message_id,
            content_type=message.content_type,
            properties=message.properties,
        )
    except BaseException as exc:
        await asyncio.shield(asyncio.to_thread(_set_edit_state, engine, original_id, False, clock))
        if isinstance(exc, ValueError):  # the transport cannot carry it; nothing was sent
            raise InvalidEdit(f"message_headers: the transport refused the message: {exc}") from exc
        raise
    await asyncio.to_thread(_resolve_edited, engine, original_id, clock)
    return result


def _canonical_id(failed_message_id: str) -> str:
    canonical = parse_guid(failed_message_id)
    if canonical is None:
        raise UnknownFailedMessages([failed_message_id])
    return canonical


def _stored_message(engine: sa.Engine, failed_message_id: str) -> tuple[dict[str, Any], str]:
    """The stored headers and retry target (the queue it failed in, or that queue's
    redirect) of an editable (Unresolved) message."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(fm.status, fm.headers_json, fm.queue_address).where(
                fm.id == failed_message_id
            )
        ).one_or_none()
        if row is None:
            raise UnknownFailedMessages([failed_message_id])
        redirected = redirect_targets(conn, [row.queue_address])
    status = FailedMessageStatus(row.status)
    if status is FailedMessageStatus.RETRY_ISSUED:
        raise MessageBeingRetried(failed_message_id)
    if status is not FailedMessageStatus.UNRESOLVED:
        raise NotRetryable({failed_message_id: status})
    return json.loads(row.headers_json), redirected.get(row.queue_address, row.queue_address)


def _check_edit(stored: Mapping[str, Any], edited: Mapping[str, str | None], body: str) -> None:
    if not body.strip():
        raise InvalidEdit("message_body is empty")
    changed = retry_wire.locked_header_changes(stored, edited)
    if changed:
        raise InvalidEdit(
            f"message_headers changes locked headers: {', '.join(changed)} "
            "(GET /api/edit/config lists them)"
        )


def _set_edit_state(engine: sa.Engine, failed_message_id: str, start: bool, clock: Clock) -> None:
    """``start``: Unresolved -> RetryIssued, only when no live batch holds the message
    (raises ``MessageBeingRetried`` otherwise); else RetryIssued -> Unresolved."""
    now = clock()
    unresolved, waiting = FailedMessageStatus.UNRESOLVED, FailedMessageStatus.RETRY_ISSUED
    old, new = (unresolved, waiting) if start else (waiting, unresolved)
    condition = [fm.id == failed_message_id, fm.status == int(old)]
    if start:
        live = sa.select(fmr.failed_message_id).where(
            fmr.failed_message_id == failed_message_id,
            fmr.retry_batch_id.in_(sa.select(rb.id).where(rb.status != str(BatchStatus.DONE))),
        )
        condition.append(~sa.exists(live))
    with begin_write(engine) as conn:
        changed = conn.execute(
            sa.update(failed_messages)
            .where(*condition)
            .values(status=int(new), status_changed_at=now, last_modified=now)
        ).rowcount
    if start and changed != 1:
        raise MessageBeingRetried(failed_message_id)


def _resolve_edited(engine: sa.Engine, failed_message_id: str, clock: Clock) -> None:
    """The copy is sent: the original is Resolved and keeps no retry claim."""
    now = clock()
    with begin_write(engine) as conn:
        conn.execute(
            sa.update(failed_messages)
            .where(
                fm.id == failed_message_id,
                fm.status == int(FailedMessageStatus.RETRY_ISSUED),
            )
            .values(
                status=int(FailedMessageStatus.RESOLVED), status_changed_at=now, last_modified=now
            )
        )
        _release_claims(conn, [failed_message_id], pending_too=True)


# --- read side ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RetryOperation:
    """One retry request and its progress. Times are UTC; counts are messages."""

    id: str
    retry_type: RetryType
    target: str | None
    originator: str | None
    classifier: str | None
    message_count: int
    forwarded_count: int
    skipped_count: int
    failed: bool
    acknowledged: bool
    started_at: datetime
    last_modified: datetime
    prepared_at: datetime | None
    completed_at: datetime | None
    failure_reason: str | None = None  # why messages were given up
    batches: tuple[RetryBatchInfo, ...] = ()

    @property
    def request_id(self) -> str:
        """ServiceControl's RequestId: the group id, queue address, endpoint or message id
        the operation targets, else the operation's own id."""
        return self.target or self.id


def get_operation(conn: sa.Connection, operation_id: str) -> RetryOperation | None:
    """Operation ``operation_id`` with its batches, ``None`` when there is none."""
    row = conn.execute(sa.select(retry_operations).where(ro.id == operation_id)).one_or_none()
    if row is None:
        return None
    batches = conn.execute(
        sa.select(rb.id, rb.initial_batch_size, rb.status)
        .where(rb.request_id == operation_id)
        .order_by(rb.started_at, rb.id)
    ).all()
    return _operation(
        row,
        tuple(RetryBatchInfo(b.id, b.initial_batch_size, BatchStatus(b.status)) for b in batches),
    )


@dataclass(frozen=True, slots=True)
class RetryHistory:
    """``historic``: the latest completed operations, newest first; ``unacknowledged``:
    completed group, queue, endpoint and all operations the operator has not dismissed
    (single-message and selection retries need no acknowledgement, as in ServiceControl)."""

    historic: list[RetryOperation]
    unacknowledged: list[RetryOperation]


def get_history(conn: sa.Connection, *, depth: int = HISTORY_DEPTH) -> RetryHistory:
    """The retry history (see ``RetryHistory``). Raises ``ValueError`` for ``depth < 1``."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    completed = ro.completed_at.is_not(None)
    historic = conn.execute(
        sa.select(retry_operations)
        .where(completed)
        .order_by(ro.completed_at.desc(), ro.id)
        .limit(depth)
    ).all()
    quiet = [str(RetryType.SINGLE_MESSAGE), str(RetryType.MULTIPLE_MESSAGES)]
    unacknowledged = conn.execute(
        sa.select(retry_operations)
        .where(completed, ro.acknowledged.is_(False), ro.retry_type.not_in(quiet))
        .order_by(ro.completed_at.desc(), ro.id)
    ).all()
    return RetryHistory(
        historic=[_operation(row) for row in historic],
        unacknowledged=[_operation(row) for row in unacknowledged],
    )


def _operation(
    row: sa.Row[*tuple[Any, ...]], batches: tuple[RetryBatchInfo, ...] = ()
) -> RetryOperation:
    values = dict(row._mapping)
    values["retry_type"] = RetryType(values["retry_type"])
    return RetryOperation(**values, batches=batches)


# --- helpers ------------------------------------------------------------------------------
def _retrying() -> tenacity.Retrying:
    """Transient store errors (deadlock, serialization failure, lost connection) retry
    the one transaction; each is idempotent or starts afresh with new ids."""
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        wait=tenacity.wait_exponential(multiplier=0.05, max=2),
        stop=tenacity.stop_after_attempt(8),
        reraise=True,
    )
