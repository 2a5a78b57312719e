"""KPI history of the outbox: a sampler writes every KPI (``queries.measure_kpis``),
globally and per channel, into ``kpi_samples`` (source ``notifications``, scope
``global`` or ``channel``) every ``kpi.sample_seconds``, under a lease; samples older than
``kpi.history_days`` are dropped (docs/design.md "Notification outbox", "KPIs"). The
trends read them back with ``db.kpi_history.read_series``."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.kpi_history import sample_rows as kpi_sample_rows
from controlroom.db.kpi_history import store_samples
from controlroom.db.providers import provider_for
from controlroom.db.transactions import begin_write
from controlroom.notifications.queries import measure_kpis
from controlroom.runtime.clock import Clock, utc_now
from controlroom.runtime.periodic import PeriodicTask

SOURCE = "notifications"
LEASE_NAME = "notification-kpi-sampler"


def sample_rows(
    scopes: dict[str, dict[str, float | int | None]], now: datetime
) -> list[dict[str, Any]]:
    """One ``kpi_samples`` row per metric and scope of ``queries.measure_kpis`` (a missing
    age is not sampled)."""
    return kpi_sample_rows(
        SOURCE,
        [("channel" if key else "global", key, values) for key, values in scopes.items()],
        now,
    )


def take_sample(engine: sa.Engine, settings: Settings, now: datetime) -> int:
    """Measure and store the KPIs at ``now``; drop this source's samples older than
    ``kpi.history_days``. Returns the number of samples written."""
    with engine.connect() as conn:
        scopes = measure_kpis(
            conn,
            now=now,
            interval=settings.kpi.interval,
            stuck_threshold=settings.kpi.stuck_threshold,
        )
    rows = sample_rows(scopes, now)
    with begin_write(engine) as conn:
        store_samples(
            conn, rows, source=SOURCE, now=now, keep=timedelta(days=settings.kpi.history_days)
        )
    return len(rows)


class NotificationKpiSampler:
    """Background task: a sample every ``kpi.sample_seconds`` while holding the lease."""

    def __init__(self, engine: sa.Engine, settings: Settings, *, clock: Clock = utc_now) -> None:
        seconds = settings.kpi.sample_seconds
        lease = provider_for(engine).make_lease(engine, LEASE_NAME, str(uuid.uuid4()), seconds * 3)
        self._periodic = PeriodicTask(
            "notification KPI sampler",
            lambda: take_sample(engine, settings, clock()),
            interval=seconds,
            lease=lease,
        )

    async def run(self) -> None:
        await self._periodic.run()
