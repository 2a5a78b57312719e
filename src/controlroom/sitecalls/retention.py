"""Retention of the site-call half: terminal site calls and old audit events are purged.

Source: docs/design.md "Site call retention" (a daily purge of terminal rows
older than 365 days, settable). At each run terminal ``site_calls`` whose
``terminal_at_utc`` is before now minus ``sitecalls.retention_days`` are deleted (along
``ix_site_calls_terminal``; non-terminal rows, Parked included, are never purged), and the
audit log's months that ended before now minus ``audit.retention_days``
(``Provider.purge_audit_log``). The audit purge takes no cutoff from the process: the
database computes it from its own clock and a floor only the owner sets
(``audit_log_policy``), and removes whole months only, so an event may be kept up to a
month longer and every month's hash chain is whole or gone (docs/design.md "Audit log").
Each run first makes the audit log's partitions for the months ahead
(``Provider.prepare_audit_log``), and last deletes the rejected telemetry kept longer than
``sitecalls.rejected_retention_days`` (``rejected.purge_rejected``). One process purges at
a time (a lease); a failed purge is logged and tried again at the next run.

Each purged call leaves a tombstone (its id and terminal stamp) written in the
transaction that deletes it and kept ``sitecalls.tombstone_days`` after that purge (so at
least that long beyond retention): meanwhile a late packet of the call is rejected instead
of re-creating it (``sitecalls.tombstones``).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.providers import provider_for
from controlroom.db.tables import site_calls
from controlroom.db.transactions import begin_write
from controlroom.runtime.clock import Clock, utc_now
from controlroom.runtime.periodic import PeriodicTask
from controlroom.sitecalls.rejected import purge_rejected
from controlroom.sitecalls.tombstones import expire_tombstones, write_tombstones
from controlroom.telemetry.ordering import TERMINAL

log = logging.getLogger(__name__)

LEASE_NAME = "sitecall-retention"
PURGE_CHUNK = 500  # rows deleted per transaction: short write locks on SQLite
sc = site_calls.c


@dataclass(frozen=True, slots=True)
class PurgeResult:
    """Rows deleted and the cutoffs used (UTC): terminal site calls before
    ``site_call_cutoff``; audit events before ``audit_cutoff``, the first month the
    database kept; tombstones a purge wrote before ``tombstone_cutoff``."""

    site_calls: int
    audit_events: int
    site_call_cutoff: datetime
    audit_cutoff: datetime
    tombstones: int
    tombstone_cutoff: datetime
    rejected_packets: int = 0
    rejected_cutoff: datetime | None = None


def purge_site_call_history(
    engine: sa.Engine,
    *,
    now: datetime,
    site_call_days: int,
    audit_days: int,
    tombstone_days: int,
    rejected_days: int | None = None,
    chunk: int = PURGE_CHUNK,
) -> PurgeResult:
    """Delete terminal site calls whose ``terminal_at_utc`` is before ``now -
    site_call_days``, each leaving a tombstone in its chunk's transaction, the audit events
    of months that ended before the database's now minus ``audit_days`` (or its floor, if
    longer), tombstones a purge wrote before ``now - tombstone_days`` and, when
    ``rejected_days`` is given, rejected telemetry kept since before ``now -
    rejected_days``; in chunks of ``chunk`` rows, each its own transaction."""
    provider = provider_for(engine)
    call_cutoff = now - timedelta(days=site_call_days)
    tombstone_cutoff = now - timedelta(days=tombstone_days)
    expired_call = sa.and_(
        sc.terminal_at_utc < call_cutoff, sc.status.in_([s.value for s in TERMINAL])
    )
    calls = 0
    while True:
        with begin_write(engine) as conn:
            purged = (
                conn.execute(
                    sa.delete(site_calls)
                    .where(
                        sc.tracked_operation_id.in_(
                            sa.select(sc.tracked_operation_id).where(expired_call).limit(chunk)
                        ),
                        expired_call,
                    )
                    .returning(sc.tracked_operation_id, sc.terminal_at_utc, sc.terminal_at_tick)
                )
                .mappings()
                .all()
            )
            write_tombstones(conn, provider, purged, now)
        calls += len(purged)
        if len(purged) < chunk:
            break
    events, audit_cutoff = provider.purge_audit_log(engine, audit_days, chunk=chunk)
    tombstones = expire_tombstones(engine, tombstone_cutoff, chunk=chunk)
    result = PurgeResult(calls, events, call_cutoff, audit_cutoff, tombstones, tombstone_cutoff)
    if rejected_days is None:
        return result
    rejected_cutoff = now - timedelta(days=rejected_days)
    rejected = purge_rejected(engine, cutoff=rejected_cutoff, chunk=chunk)
    return replace(result, rejected_packets=rejected, rejected_cutoff=rejected_cutoff)


class SiteCallRetention:
    """Background task: purge every ``sitecalls.purge_interval_seconds`` (daily) while
    holding the lease (``runtime.periodic``: a failed purge is logged and the schedule
    goes on)."""

    def __init__(self, engine: sa.Engine, settings: Settings, *, clock: Clock = utc_now) -> None:
        self._engine = engine
        self._settings = settings
        self._clock = clock
        interval = settings.sitecalls.purge_interval_seconds
        self._lease = provider_for(engine).make_lease(
            engine, LEASE_NAME, str(uuid.uuid4()), interval * 2
        )
        self._periodic = PeriodicTask(
            "site-call purge", self._purge, interval=interval, jitter=0.1, lease=self._lease
        )

    def purge_once(self) -> PurgeResult | None:
        """One purge when this process holds the lease; ``None`` when another does."""
        if not self._lease.hold():
            return None
        return self._purge()

    def _purge(self) -> PurgeResult:
        now = self._clock()
        provider_for(self._engine).prepare_audit_log(self._engine)
        result = purge_site_call_history(
            self._engine,
            now=now,
            site_call_days=self._settings.sitecalls.retention_days,
            audit_days=self._settings.audit.retention_days,
            tombstone_days=self._settings.sitecalls.tombstone_days,
            rejected_days=self._settings.sitecalls.rejected_retention_days,
        )
        if result.site_calls or result.audit_events or result.tombstones or result.rejected_packets:
            log.info(
                "purged %d terminal site calls, %d audit events, %d expired tombstones "
                "and %d rejected packets",
                result.site_calls,
                result.audit_events,
                result.tombstones,
                result.rejected_packets,
            )
        return result

    async def run(self) -> None:
        """Purge until cancelled; the lease is released once a running purge ended."""
        await self._periodic.run()
