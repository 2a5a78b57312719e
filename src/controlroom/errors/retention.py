"""Retention: Resolved and Archived failed messages older than the retention period go.

Source: DESIGN.md "Retention". The cutoff is recomputed on every run (now minus
``error_retention_period``), the scan rides the partial index on ``status_changed_at``
for statuses 2 and 4, and the external bodies of deleted rows are deleted too. One
process sweeps at a time (a database lease, DESIGN.md "Background singletons").

Bodies are deleted after the rows' commit, so a crash in between leaves orphan files,
never rows that point at missing bodies. A message that fails again at the very moment
its old row is swept may, in a narrow window, lose its new external body; its headers and
inline prefix stay.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa

from controlroom.db.engine import begin_write
from controlroom.db.providers import provider_for
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_groups,
    failed_message_retries,
    failed_messages,
)
from controlroom.errors.ingest.bodies import BodyStore
from controlroom.errors.ingest.writer import Clock, utc_now

log = logging.getLogger(__name__)

LEASE_NAME = "error-retention"
SWEEP_CHUNK = 500  # rows deleted per transaction: short write locks on SQLite
_EXPIRING = (int(FailedMessageStatus.RESOLVED), int(FailedMessageStatus.ARCHIVED))


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one sweep did: rows deleted and the cutoff it used (UTC)."""

    deleted: int
    cutoff: datetime


def sweep_expired_failed_messages(
    engine: sa.Engine,
    body_store: BodyStore,
    *,
    retention_period: timedelta,
    now: datetime,
    chunk: int = SWEEP_CHUNK,
) -> SweepResult:
    """Delete Resolved/Archived rows whose ``status_changed_at`` is before now - period.

    Works in chunks of ``chunk`` rows, each its own transaction; a row that changed status
    since it was selected is left alone (the DELETE re-checks the condition).
    """
    cutoff = now - retention_period
    expired = sa.and_(
        failed_messages.c.status.in_(_EXPIRING), failed_messages.c.status_changed_at < cutoff
    )
    deleted = 0
    while True:
        with begin_write(engine) as conn:
            ids = (
                conn.execute(sa.select(failed_messages.c.id).where(expired).limit(chunk))
                .scalars()
                .all()
            )
            if not ids:
                return SweepResult(deleted=deleted, cutoff=cutoff)
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
            gone = conn.execute(
                sa.delete(failed_messages)
                .where(failed_messages.c.id.in_(ids), expired)
                .returning(failed_messages.c.id, failed_messages.c.body_stored_externally)
            ).all()
        for row in gone:
            if row.body_stored_externally:
                body_store.delete_message(row.id)
        deleted += len(gone)


class RetentionSweeper:
    """Background task: sweep every ``interval_seconds`` while holding the lease.

    A failed sweep is logged and the schedule goes on.
    """

    def __init__(
        self,
        engine: sa.Engine,
        body_store: BodyStore,
        *,
        retention_period: timedelta,
        interval_seconds: float = 3600.0,
        lease_seconds: float = 7200.0,
        clock: Clock = utc_now,
    ) -> None:
        self._engine = engine
        self._body_store = body_store
        self._retention_period = retention_period
        self._interval = interval_seconds
        self._clock = clock
        self._lease = provider_for(engine).make_lease(
            engine, LEASE_NAME, str(uuid.uuid4()), lease_seconds
        )

    async def run(self) -> None:
        """Sweep until cancelled."""
        try:
            while True:
                try:
                    await asyncio.to_thread(self.sweep_once)
                except Exception:
                    log.warning(
                        "retention sweep failed; next in %.0f s", self._interval, exc_info=True
                    )
                await asyncio.sleep(self._interval)
        finally:
            await asyncio.shield(asyncio.to_thread(self._lease.release))

    def sweep_once(self) -> SweepResult | None:
        """One sweep when this process holds the lease; ``None`` when another does."""
        if not self._lease.hold():
            return None
        result = sweep_expired_failed_messages(
            self._engine,
            self._body_store,
            retention_period=self._retention_period,
            now=self._clock(),
        )
        if result.deleted:
            log.info(
                "retention deleted %d failed messages older than %s",
                result.deleted,
                result.cutoff.isoformat(),
            )
        return result
