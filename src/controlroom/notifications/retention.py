"""Retention of the outbox: terminal notifications (Delivered, Failed, Discarded) whose
``terminal_at_utc`` is older than ``notifications.retention_days`` (default 365) are
deleted, once a day by default, in chunks of short transactions along
``ix_notifications_terminal_at_utc``. Pending, Retrying and Parked notifications are never
purged (docs/design.md "Notification outbox"). One process purges at a time (a lease);
a failed purge is logged and tried again at the next run. An operator's action or a
dispatcher's outcome on a purged notification finds no row and changes nothing.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.providers import provider_for
from controlroom.db.tables import notifications
from controlroom.db.transactions import begin_write
from controlroom.notifications.lifecycle import TERMINAL
from controlroom.runtime.clock import Clock, utc_now
from controlroom.runtime.periodic import PeriodicTask

log = logging.getLogger(__name__)

LEASE_NAME = "notification-retention"
PURGE_CHUNK = 500
nc = notifications.c


def purge_notifications(
    engine: sa.Engine, *, now: datetime, retention_days: int, chunk: int = PURGE_CHUNK
) -> int:
    """Delete terminal notifications that ended before ``now - retention_days``; answers
    how many, in transactions of at most ``chunk`` rows."""
    expired = sa.and_(
        nc.terminal_at_utc < now - timedelta(days=retention_days),
        nc.status.in_([status.value for status in TERMINAL]),
    )
    purged = 0
    while True:
        with begin_write(engine) as conn:
            deleted = conn.execute(
                sa.delete(notifications).where(
                    nc.notification_id.in_(
                        sa.select(nc.notification_id).where(expired).limit(chunk)
                    ),
                    expired,
                )
            ).rowcount
        purged += deleted
        if deleted < chunk:
            return purged


class NotificationRetention:
    """Background task: purge every ``notifications.purge_interval_seconds`` (daily)
    while holding the lease."""

    def __init__(self, engine: sa.Engine, settings: Settings, *, clock: Clock = utc_now) -> None:
        self._engine = engine
        self._days = settings.notifications.retention_days
        self._clock = clock
        interval = settings.notifications.purge_interval_seconds
        lease = provider_for(engine).make_lease(engine, LEASE_NAME, str(uuid.uuid4()), interval * 2)
        self._periodic = PeriodicTask(
            "notification purge", self._purge, interval=interval, jitter=0.1, lease=lease
        )

    async def run(self) -> None:
        await self._periodic.run()

    def _purge(self) -> None:
        purged = purge_notifications(self._engine, now=self._clock(), retention_days=self._days)
        if purged:
            log.info("notification purge: %d terminal notifications deleted", purged)
