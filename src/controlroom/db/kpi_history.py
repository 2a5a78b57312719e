"""The KPIs' shape and their history, shared by the site calls and the notification
outbox: the figures of one scope, the ``kpi_samples`` rows a sampler writes, and a
series read back, downsampled.

Source: docs/design.md "KPIs" (every KPI sampled every 60 s, kept 90 days, drawn as
trends) and "Notification outbox" (KPIs of the same shape as the site calls'). Each half
measures its own figures and samples them under its own ``source`` (``sitecalls``,
``notifications``) and scopes (``global`` with key ``""``; ``site`` and ``node`` of site
calls, ``channel`` of notifications); everything here takes the source as an argument.
A scope with nothing pending and nothing finished in the interval may have no sample at
an instant (read it as zero); a missing age is never sampled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

import sqlalchemy as sa

from controlroom.db.providers import provider_for
from controlroom.db.tables import kpi_samples

ks = kpi_samples.c

Metric = Literal[
    "buffered",
    "parked",
    "failed_last_interval",
    "delivered_last_interval",
    "oldest_pending_age_seconds",
    "stuck",
]
METRICS: tuple[Metric, ...] = get_args(Metric)

KpiValues = Mapping[str, float | int | None]
"""The KPIs of one scope by metric name (``METRICS``); the age in seconds or ``None``."""


@dataclass
class KpiFigures:
    """The KPIs of one scope; ``oldest_pending_created`` is the basis of the age."""

    buffered: int = 0
    parked: int = 0
    failed_last_interval: int = 0
    delivered_last_interval: int = 0
    stuck: int = 0
    oldest_pending_created: datetime | None = None

    def add(self, other: KpiFigures) -> None:
        """Sum ``other`` into these figures (the oldest of the two pending)."""
        self.buffered += other.buffered
        self.parked += other.parked
        self.failed_last_interval += other.failed_last_interval
        self.delivered_last_interval += other.delivered_last_interval
        self.stuck += other.stuck
        if other.oldest_pending_created is not None and (
            self.oldest_pending_created is None
            or other.oldest_pending_created < self.oldest_pending_created
        ):
            self.oldest_pending_created = other.oldest_pending_created

    def as_dict(self, now: datetime) -> dict[str, float | int | None]:
        """The KPIs by metric name (``METRICS``); the age in seconds at ``now``."""
        age = (
            None
            if self.oldest_pending_created is None
            else max(0.0, (now - self.oldest_pending_created).total_seconds())
        )
        return {
            "buffered": self.buffered,
            "parked": self.parked,
            "failed_last_interval": self.failed_last_interval,
            "delivered_last_interval": self.delivered_last_interval,
            "oldest_pending_age_seconds": age,
            "stuck": self.stuck,
        }


# --- writing samples ----------------------------------------------------------------------
def sample_rows(
    source: str, scopes: Iterable[tuple[str, str, KpiValues]], now: datetime
) -> list[dict[str, Any]]:
    """One ``kpi_samples`` row per metric of each ``(scope, scope key, values)``, captured
    at ``now`` (a missing value, the age of nothing pending, is not sampled)."""
    return [
        {
            "source": source,
            "metric": metric,
            "scope": scope,
            "scope_key": key,
            "captured_at_utc": now,
            "value": float(value),
        }
        for scope, key, values in scopes
        for metric, value in values.items()
        if value is not None
    ]


def store_samples(
    conn: sa.Connection,
    rows: list[dict[str, Any]],
    *,
    source: str,
    now: datetime,
    keep: timedelta,
) -> None:
    """Insert ``rows`` (a sample already stored at that instant is kept as it is) and drop
    the samples of ``source`` captured more than ``keep`` before ``now``, in the caller's
    transaction."""
    provider_for(conn).insert_rows_if_absent(conn, kpi_samples, rows)
    conn.execute(sa.delete(kpi_samples).where(ks.source == source, ks.captured_at_utc < now - keep))


# --- reading a series ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One point of a series: its first sample's time (UTC), the mean of its samples, their
    minimum and maximum, and how many there were (1 when not downsampled)."""

    captured_at_utc: datetime
    value: float
    min: float
    max: float
    samples: int


def downsample(
    samples: list[tuple[datetime, float]], start: datetime, end: datetime, max_points: int
) -> list[SeriesPoint]:
    """At most ``max_points`` points for ``samples`` (sorted, all in ``[start, end]``).

    With no more samples than ``max_points`` each is its own point. Otherwise
    ``[start, end]`` is cut into ``max_points`` equal buckets and each non-empty bucket
    becomes one point (the mean, least and greatest of its samples, and how many) at its
    first sample's time: never before a value was sampled. Pure.
    """
    if len(samples) <= max_points:
        return [SeriesPoint(t, v, v, v, 1) for t, v in samples]
    width = (end - start) / max_points
    if width <= timedelta(0):  # every sample at one instant: one bucket
        values = [value for _, value in samples]
        return [
            SeriesPoint(start, sum(values) / len(values), min(values), max(values), len(values))
        ]
    buckets: dict[int, tuple[datetime, list[float]]] = {}
    for captured, value in samples:
        index = min(int((captured - start) / width), max_points - 1)
        buckets.setdefault(index, (captured, []))[1].append(value)
    return [
        SeriesPoint(first, sum(values) / len(values), min(values), max(values), len(values))
        for _, (first, values) in sorted(buckets.items())
    ]


def first_sample_at(
    conn: sa.Connection, *, source: str, scope: str, scope_key: str
) -> datetime | None:
    """When the first ``buffered`` sample (every sample takes one) of a scope of
    ``source`` kept was captured; ``None`` when there is none. One seek along the primary
    key."""
    return conn.execute(
        sa.select(sa.func.min(ks.captured_at_utc)).where(
            ks.source == source,
            ks.metric == "buffered",
            ks.scope == scope,
            ks.scope_key == scope_key,
        )
    ).scalar_one_or_none()


def read_series(
    conn: sa.Connection,
    *,
    source: str,
    metric: str,
    scope: str,
    scope_key: str,
    start: datetime,
    end: datetime,
    max_points: int,
) -> list[SeriesPoint]:
    """The samples of one metric and scope of ``source`` in ``[start, end]``, downsampled
    (read along the primary key of ``kpi_samples``)."""
    rows = conn.execute(
        sa.select(ks.captured_at_utc, ks.value)
        .where(
            ks.source == source,
            ks.metric == metric,
            ks.scope == scope,
            ks.scope_key == scope_key,
            ks.captured_at_utc >= start,
            ks.captured_at_utc <= end,
        )
        .order_by(ks.captured_at_utc)
    ).all()
    return downsample([(row.captured_at_utc, row.value) for row in rows], start, end, max_points)
