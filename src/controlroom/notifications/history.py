"""KPI history of the outbox: a sampler writes every KPI (``queries.measure_kpis``),
globally and per channel, into ``kpi_samples`` (source ``notifications``, scope
``global`` or ``channel``) every ``kpi.sample_seconds``, under a lease; samples older than
``kpi.history_days`` are dropped (docs/design.md "Notification outbox", "KPIs")."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.providers import provider_for
from controlroom.db.tables import kpi_samples
from controlroom.db.transactions import begin_write
from controlroom.notifications.queries import Kpis, measure_kpis
from controlroom.runtime.clock import Clock, utc_now
from controlroom.runtime.periodic import PeriodicTask

SOURCE = "notifications"
LEASE_NAME = "notification-kpi-sampler"
ks = kpi_samples.c


def sample_rows(scopes: dict[str, Kpis], now: datetime) -> list[dict[str, Any]]:
    """One ``kpi_samples`` row per metric and scope (a missing age is not sampled)."""
    return [
        {
            "source": SOURCE,
            "metric": metric,
            "scope": "channel" if key else "global",
            "scope_key": key,
            "captured_at_utc": now,
            "value": float(value),
        }
        for key, kpis in scopes.items()
        for metric, value in asdict(kpis).items()
        if value is not None
    ]


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
        provider_for(engine).insert_rows_if_absent(conn, kpi_samples, rows)
        conn.execute(
            sa.delete(kpi_samples).where(
                ks.source == SOURCE,
                ks.captured_at_utc < now - timedelta(days=settings.kpi.history_days),
            )
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
