"""Retention: Resolved and Archived failed messages older than the retention period go.

Source: docs/design.md "Retention". The cutoff is recomputed on every run (now minus
``error_retention_period``), the scan rides the partial index on ``status_changed_at``
for statuses 2 and 4, and the external bodies of deleted rows are deleted too. One
process sweeps at a time (a database lease, docs/design.md "Background singletons").

No committed row ever points at a missing body, under any interleaving with ingestion
(docs/decisions.md "No committed row points at a missing body"). The sweep does not delete files: in
the transaction that deletes the rows it records their messages in ``body_deletions``; the body
collector then deletes the files of each recorded message while it holds that record (the row lock
of its DELETE, or SQLite's write lock), keeping the body the message's current row names when the
message failed again meanwhile. The writer, in the transaction of every batch with external bodies,
deletes the records of those messages (waiting for a collector that holds one) and then writes again
any of its bodies that is missing, so a body the collector took is back before the row that names it
commits. A collector that fails or crashes leaves the record, and the next run finishes the job.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from prometheus_client import Counter

from controlroom import events
from controlroom.db.engine import run_write_transaction
from controlroom.db.providers import provider_for
from controlroom.db.tables import (
    FailedMessageStatus,
    body_deletions,
    failed_message_group_comments,
    failed_message_groups,
    failed_message_retries,
    failed_messages,
    retry_batches,
    retry_operation_messages,
    retry_operations,
)
from controlroom.errors import activity
from controlroom.errors.ingest.bodies import BodyStore
from controlroom.exceptions import BodyStoreError
from controlroom.runtime.clock import Clock, utc_now
from controlroom.runtime.periodic import PeriodicTask

log = logging.getLogger(__name__)

SWEPT = Counter(
    "controlroom_retention_deleted_total",
    "Failed messages deleted by the retention sweep",
)

LEASE_NAME = "error-retention"
SWEEP_CHUNK = 500  # rows deleted per transaction: short write locks on SQLite
_EXPIRING = (int(FailedMessageStatus.RESOLVED), int(FailedMessageStatus.ARCHIVED))


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one sweep did: rows deleted, the cutoff it used (UTC), messages whose bodies
    were deleted and messages whose body deletion failed (left for the next sweep)."""

    deleted: int
    cutoff: datetime
    bodies_collected: int = 0
    body_failures: int = 0


@dataclass(frozen=True, slots=True)
class BodyCollection:
    """What one run of the body collector did, in messages."""

    collected: int
    failed: int


def sweep_expired_failed_messages(
    engine: sa.Engine,
    body_store: BodyStore,
    *,
    retention_period: timedelta,
    now: datetime,
    chunk: int = SWEEP_CHUNK,
    event_retention_period: timedelta | None = None,
) -> SweepResult:
    """Delete Resolved/Archived rows whose ``status_changed_at`` is before now - period.

    Works in chunks of ``chunk`` rows, each its own transaction; a row that changed status
    since it was selected is left alone (the DELETE re-checks the condition). The deleted
    messages' bodies are then deleted by ``collect_deleted_bodies``; a body that cannot be
    deleted is logged and left for the next sweep, and the sweep goes on. Event log items
    older than ``event_retention_period`` (when given) are purged in the sweep's last
    transaction, which also logs the sweep when it deleted anything.
    """
    cutoff = now - retention_period
    expired = sa.and_(
        failed_messages.c.status.in_(_EXPIRING), failed_messages.c.status_changed_at < cutoff
    )
    provider = provider_for(engine)
    deleted = 0

    def sweep_chunk(conn: sa.Connection) -> list[str] | None:
        """One chunk deleted (its ids), or ``None`` when none was left and the sweep's
        last transaction ran. Safe to replay: it selects its rows again."""
        ids = (
            conn.execute(sa.select(failed_messages.c.id).where(expired).limit(chunk))
            .scalars()
            .all()
        )
        if not ids:
            _purge_retry_operations(conn, completed_before=cutoff)
            purged = 0
            if event_retention_period is not None:
                purged = events.purge_events(conn, older_than=now - event_retention_period)
            if deleted or purged:
                activity.retention_swept(
                    conn, deleted, cutoff=cutoff, events_purged=purged, now=now
                )
            return None
        group_ids = (
            conn.execute(
                sa.select(failed_message_groups.c.group_id)
                .where(failed_message_groups.c.failed_message_id.in_(ids))
                .distinct()
            )
            .scalars()
            .all()
        )
        conn.execute(
            sa.delete(failed_message_groups).where(
                failed_message_groups.c.failed_message_id.in_(ids)
            )
        )
        conn.execute(
            sa.delete(failed_message_retries).where(
                failed_message_retries.c.failed_message_id.in_(ids)
            )
        )
        gone = list(
            conn.execute(
                sa.delete(failed_messages)
                .where(failed_messages.c.id.in_(ids), expired)
                .returning(failed_messages.c.id)
            )
            .scalars()
            .all()
        )
        # Every deleted message, not only those whose current body is external: an older
        # attempt may have left a body of its own.
        provider.insert_rows_if_absent(
            conn, body_deletions, [{"failed_message_id": id_, "requested_at": now} for id_ in gone]
        )
        _delete_comments_of_emptied_groups(conn, group_ids)
        return gone

    # Each chunk its own transaction, replayed on a deadlock or serialization failure
    # (docs/design.md "Transient failures"): the writer and operators change the same rows.
    while (gone := run_write_transaction(engine, sweep_chunk)) is not None:
        deleted += len(gone)
        SWEPT.inc(len(gone))
    bodies = collect_deleted_bodies(engine, body_store, chunk=chunk)
    return SweepResult(
        deleted=deleted,
        cutoff=cutoff,
        bodies_collected=bodies.collected,
        body_failures=bodies.failed,
    )


def _purge_retry_operations(conn: sa.Connection, *, completed_before: datetime) -> None:
    """Retry operations completed before the cutoff go, with their batches, the claims
    those (done) batches still hold and the ids they claimed, kept for their outcome
    (docs/decisions.md "Completed retry operations are purged", "A retry's outcome counts
    the failures since"). Unfinished ones stay."""
    old = sa.select(retry_operations.c.id).where(retry_operations.c.completed_at < completed_before)
    batches = sa.select(retry_batches.c.id).where(retry_batches.c.request_id.in_(old))
    conn.execute(
        sa.delete(retry_operation_messages).where(retry_operation_messages.c.operation_id.in_(old))
    )
    conn.execute(
        sa.delete(failed_message_retries).where(
            failed_message_retries.c.retry_batch_id.in_(batches)
        )
    )
    conn.execute(sa.delete(retry_batches).where(retry_batches.c.request_id.in_(old)))
    conn.execute(
        sa.delete(retry_operations).where(retry_operations.c.completed_at < completed_before)
    )


def _delete_comments_of_emptied_groups(conn: sa.Connection, group_ids: Sequence[str]) -> None:
    """A group exists only through its messages: once the sweep took the last one, the
    operator's comment on it goes too (docs/decisions.md "A group's comment goes with its
    last message")."""
    if not group_ids:
        return
    still_used = sa.exists().where(
        failed_message_groups.c.group_id == failed_message_group_comments.c.group_id
    )
    conn.execute(
        sa.delete(failed_message_group_comments).where(
            failed_message_group_comments.c.group_id.in_(group_ids), ~still_used
        )
    )


def collect_deleted_bodies(
    engine: sa.Engine, body_store: BodyStore, *, chunk: int = SWEEP_CHUNK
) -> BodyCollection:
    """Delete the bodies of the messages recorded in ``body_deletions``.

    Each chunk is one transaction that takes the records (DELETE ... RETURNING), deletes
    the files while holding them, and puts back the records of the messages whose files
    could not be deleted (``BodyStoreError``, logged). A message that failed again since
    its row was swept keeps the body its current row names. See the module docstring for
    why no row can end up pointing at a missing body.
    """
    provider = provider_for(engine)
    pending = body_deletions.c.failed_message_id
    collected = 0
    failed: list[str] = []

    def collect_chunk(conn: sa.Connection) -> tuple[int, list[str]] | None:
        """One chunk: (bodies deleted, messages kept back), or ``None`` when no record
        is left. Safe to replay: a rolled-back chunk leaves its records, and deleting a
        message's files again is the next run's job done early."""
        choose = sa.select(pending).order_by(pending).limit(chunk)
        if failed:
            choose = choose.where(pending.not_in(failed))
        taken = (
            conn.execute(
                sa.delete(body_deletions)
                .where(pending.in_(choose.scalar_subquery()))
                .returning(pending)
            )
            .scalars()
            .all()
        )
        if not taken:
            return None
        current = dict(
            conn.execute(
                sa.select(failed_messages.c.id, failed_messages.c.body_key).where(
                    failed_messages.c.id.in_(taken), failed_messages.c.body_stored_externally
                )
            ).all()
        )
        kept_back = []
        for message_id in taken:
            try:
                body_store.delete_message(message_id, keep=current.get(message_id))
            except BodyStoreError:
                log.warning(
                    "could not delete the bodies of %s; the next sweep tries again",
                    message_id,
                    exc_info=True,
                )
                kept_back.append(message_id)
        provider.insert_rows_if_absent(
            conn,
            body_deletions,
            [{"failed_message_id": id_, "requested_at": utc_now()} for id_ in kept_back],
        )
        return len(taken) - len(kept_back), kept_back

    while (done := run_write_transaction(engine, collect_chunk)) is not None:
        collected += done[0]
        failed.extend(done[1])
    return BodyCollection(collected=collected, failed=len(failed))


class RetentionSweeper:
    """Background task: sweep every ``interval_seconds``, each sweep under the lease.

    A failed sweep is logged and the schedule goes on. ``lease_seconds`` bounds how long
    a lease row (SQLite) outlives a process that died while sweeping.
    """

    def __init__(
        self,
        engine: sa.Engine,
        body_store: BodyStore,
        *,
        retention_period: timedelta,
        event_retention_period: timedelta | None = None,
        interval_seconds: float = 3600.0,
        lease_seconds: float = 7200.0,
        clock: Clock = utc_now,
    ) -> None:
        self._engine = engine
        self._body_store = body_store
        self._retention_period = retention_period
        self._event_retention_period = event_retention_period
        self._clock = clock
        self._lease = provider_for(engine).make_lease(
            engine, LEASE_NAME, str(uuid.uuid4()), lease_seconds
        )
        # No lease for the loop: each sweep takes and releases its own (sweep_once).
        self._periodic = PeriodicTask(
            "retention sweep", self.sweep_once, interval=interval_seconds, jitter=0.1
        )

    async def run(self) -> None:
        """Sweep until cancelled; a running sweep is waited for (``runtime.periodic``)."""
        await self._periodic.run()

    def sweep_once(self) -> SweepResult | None:
        """One sweep when this process can take the lease; ``None`` when another process
        is sweeping right now. The lease is held only while sweeping (docs/decisions.md
        "The sweep holds its lease only while sweeping")."""
        if not self._lease.hold():
            return None
        try:
            result = sweep_expired_failed_messages(
                self._engine,
                self._body_store,
                retention_period=self._retention_period,
                now=self._clock(),
                event_retention_period=self._event_retention_period,
            )
        finally:
            self._lease.release()
        if result.deleted:
            log.info(
                "retention deleted %d failed messages older than %s",
                result.deleted,
                result.cutoff.isoformat(),
            )
        return result
