"""KPI history of the site calls: a sampler writes every KPI of every scope into
``kpi_samples`` (source ``sitecalls``); ``db.kpi_history`` writes the rows and reads a
series back, downsampled, for both halves.

Source: docs/design.md "KPIs" (sampled every 60 s, kept 90
days) and "Background singletons" (one process samples, under a lease). Scopes:
``global`` (key ``""``), ``site`` (key: the site), ``node`` (key: ``site/node``; a call
without a node counts under ``site/``). A scope with nothing pending and nothing
finished in the interval has no sample at that instant (read it as zero).

A sample whose parked or stuck calls, globally or of one site, reach
``kpi.alert_parked`` / ``kpi.alert_stuck`` while the previous sample's were below raises
``ParkedSiteCallsPassedThreshold`` / ``StuckSiteCallsPassedThreshold`` in the
transaction that stores it: one event per crossing, none while it stays above.
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.kpi_history import KpiValues, store_samples
from controlroom.db.kpi_history import sample_rows as kpi_sample_rows
from controlroom.db.providers import provider_for
from controlroom.db.tables import kpi_samples
from controlroom.db.transactions import begin_write
from controlroom.event_types import EventType
from controlroom.events import Category, Severity, record_event, site_path
from controlroom.runtime.clock import Clock, utc_now
from controlroom.runtime.periodic import PeriodicTask
from controlroom.sitecalls.kpis import KpiReport, measure_kpis

log = logging.getLogger(__name__)

SOURCE = "sitecalls"
LEASE_NAME = "sitecall-kpi-sampler"
Scope = Literal["global", "site", "node"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
ks = kpi_samples.c


def node_scope_key(site: str, node: str | None) -> str:
    return f"{site}/{node or ''}"


def sample_rows(report: KpiReport) -> list[dict[str, Any]]:
    """One ``kpi_samples`` row per metric and scope of ``report`` (a missing age is not
    sampled: there is no pending call to be old)."""
    scopes: list[tuple[str, str, KpiValues]] = [("global", "", report.total().as_dict(report.now))]
    scopes += [("site", site, f.as_dict(report.now)) for site, f in report.sites().items()]
    scopes += [
        ("node", node_scope_key(site, node), f.as_dict(report.now))
        for (site, node), f in report.by_node.items()
    ]
    return kpi_sample_rows(SOURCE, scopes, report.now)


def take_sample(engine: sa.Engine, settings: Settings, now: datetime) -> int:
    """Measure every scope at ``now``, store the samples, drop samples older than
    ``kpi.history_days``. Returns the number of samples written."""
    with engine.connect() as conn:
        report = measure_kpis(
            conn,
            now=now,
            interval=settings.kpi.interval,
            stuck_threshold=settings.kpi.stuck_threshold,
        )
    rows = sample_rows(report)
    with begin_write(engine) as conn:
        previous = _previous_sample(conn, now)
        store_samples(
            conn, rows, source=SOURCE, now=now, keep=timedelta(days=settings.kpi.history_days)
        )
        _raise_crossings(conn, settings, previous, rows, now)
    return len(rows)


ALERTS = {
    "parked": (EventType.PARKED_SITE_CALLS_PASSED_THRESHOLD, "alert_parked"),
    "stuck": (EventType.STUCK_SITE_CALLS_PASSED_THRESHOLD, "alert_stuck"),
}
"""The watched metric, its event and its threshold's setting (``kpi.<setting>``)."""

SampleKey = tuple[str, str, str]
"""(metric, scope, scope key) of a watched sample."""


def _previous_sample(conn: sa.Connection, now: datetime) -> dict[SampleKey, float]:
    """The watched metrics of the last sample before ``now``, global and per site (a
    scope without a row is zero); empty before the first sample."""
    latest = conn.execute(
        sa.select(sa.func.max(ks.captured_at_utc)).where(
            ks.source == SOURCE,
            ks.metric == "buffered",
            ks.scope == "global",
            ks.scope_key == "",
            ks.captured_at_utc < now,
        )
    ).scalar_one_or_none()
    if latest is None:
        return {}
    rows = conn.execute(
        sa.select(ks.metric, ks.scope, ks.scope_key, ks.value).where(
            ks.source == SOURCE,
            ks.metric.in_(list(ALERTS)),
            ks.scope.in_(["global", "site"]),
            ks.captured_at_utc == latest,
        )
    ).all()
    return {(row.metric, row.scope, row.scope_key): row.value for row in rows}


def _raise_crossings(
    conn: sa.Connection,
    settings: Settings,
    previous: dict[SampleKey, float],
    rows: list[dict[str, Any]],
    now: datetime,
) -> None:
    """One event per watched metric and scope that reached its threshold (module
    docstring)."""
    for row in rows:
        if row["metric"] not in ALERTS or row["scope"] not in ("global", "site"):
            continue
        event_type, setting = ALERTS[row["metric"]]
        threshold = getattr(settings.kpi, setting)
        before = previous.get((row["metric"], row["scope"], row["scope_key"]), 0.0)
        if not before < threshold <= row["value"]:
            continue
        where = "across all sites" if row["scope"] == "global" else f"of site {row['scope_key']}"
        record_event(
            conn,
            description=(
                f"{crossing_count(row['value'], row['metric'])} {where} "
                f"(threshold {threshold}; {before:.0f} at the previous sample)"
            ),
            severity=Severity.WARNING,
            category=Category.SITE_CALLS,
            event_type=event_type,
            raised_at=now,
            related_to=[site_path(row["scope_key"])] if row["scope"] == "site" else [],
        )


def crossing_count(value: float, metric: str) -> str:
    """``1 stuck site call``, ``3 parked site calls``: a watched figure in words."""
    calls = "site call" if round(value) == 1 else "site calls"
    return f"{value:.0f} {metric} {calls}"


class KpiSampler:
    """Background task: a sample every ``kpi.sample_seconds`` while holding the lease
    (``runtime.periodic``: a failed sample is logged and the schedule goes on)."""

    def __init__(self, engine: sa.Engine, settings: Settings, *, clock: Clock = utc_now) -> None:
        self._engine = engine
        self._settings = settings
        self._clock = clock
        seconds = settings.kpi.sample_seconds
        self._lease = provider_for(engine).make_lease(
            engine, LEASE_NAME, str(uuid.uuid4()), seconds * 3
        )
        self._periodic = PeriodicTask(
            "KPI sampler", self._sample, interval=seconds, lease=self._lease
        )
        self._intake_seen = threading.Event()

    def intake_written(self) -> None:
        """Telemetry was written. The first time since start, sample now rather than at
        the end of the wait (docs/decisions.md "A chart spans the history that exists"):
        the sample at start may have come before any telemetry. Thread-safe."""
        if not self._intake_seen.is_set():
            self._intake_seen.set()
            self._periodic.wake()

    def sample_once(self) -> int | None:
        """One sample when this process holds the lease; ``None`` when another does."""
        if not self._lease.hold():
            return None
        return self._sample()

    def _sample(self) -> int:
        return take_sample(self._engine, self._settings, self._clock())

    async def run(self) -> None:
        """Sample until cancelled; the lease is released once a running sample ended."""
        await self._periodic.run()
