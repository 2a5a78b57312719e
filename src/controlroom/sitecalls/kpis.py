"""Site-call KPIs at an instant, globally, per source site and per source node.

Source: docs/design.md "KPIs"; docs/decisions.md "KPIs are read from indexes and sampled
by one process". At ``now``:

- ``buffered``: non-terminal and not Parked (``ordering.BUFFERED``);
- ``parked``: Parked (awaits an operator);
- ``failed_last_interval`` / ``delivered_last_interval``: Failed / Delivered with
  ``terminal_at_utc`` in ``(now - interval, now]``;
- ``oldest_pending_age_seconds``: seconds since the oldest buffered call was created
  (``None`` when nothing is buffered);
- ``stuck``: buffered and created more than ``stuck_threshold`` before ``now``.

Two grouped statements answer every scope at once, each from an index of migration 0005:
non-terminal rows from the partial index ``ix_site_calls_pending`` (its predicate is
repeated here word for word, so both providers recognise it), terminal ones from
``ix_site_calls_terminal`` by terminal time. The scopes are sums of the per-node figures
(``db.kpi_history.KpiFigures``, the shape the notification outbox's KPIs share).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import sqlalchemy as sa

from controlroom.db.kpi_history import KpiFigures
from controlroom.db.tables import site_calls
from controlroom.telemetry.ordering import BUFFERED, SiteCallStatus

sc = site_calls.c

# Must equal the predicate of ix_site_calls_pending (migration 0005).
PENDING_PREDICATE = sa.text(
    "site_calls.status IN ('Submitted', 'Forwarded', 'Attempted', 'Skipped', 'Parked')"
)
_BUFFERED = frozenset(status.value for status in BUFFERED)


NodeKey = tuple[str, str | None]
"""(source_site, source_node)."""


@dataclass
class KpiReport:
    """Figures per node; the site and global scopes are their sums."""

    now: datetime
    by_node: dict[NodeKey, KpiFigures] = field(default_factory=dict)

    def node(self, key: NodeKey) -> KpiFigures:
        return self.by_node.setdefault(key, KpiFigures())

    def total(self, keys: Iterable[NodeKey] | None = None) -> KpiFigures:
        figures = KpiFigures()
        for key in self.by_node if keys is None else keys:
            if key in self.by_node:
                figures.add(self.by_node[key])
        return figures

    def sites(self) -> dict[str, KpiFigures]:
        result: dict[str, KpiFigures] = {}
        for (site, _node), figures in self.by_node.items():
            result.setdefault(site, KpiFigures()).add(figures)
        return result


def measure_kpis(
    conn: sa.Connection,
    *,
    now: datetime,
    interval: timedelta,
    stuck_threshold: timedelta,
    site: str | None = None,
    node: str | None = None,
) -> KpiReport:
    """The KPIs at ``now`` of every node, optionally only of ``site`` (and ``node``)."""
    scope: list[sa.ColumnElement[bool]] = []
    if site is not None:
        scope.append(sc.source_site == site)
    if node is not None:
        scope.append(sc.source_node == node)
    report = KpiReport(now=now)
    stuck_before = now - stuck_threshold
    pending = (
        sa.select(
            sc.source_site,
            sc.source_node,
            sc.status,
            sa.func.count().label("calls"),
            sa.func.min(sc.created_at_utc).label("oldest"),
            sa.func.count(sa.case((sc.created_at_utc < stuck_before, 1))).label("old"),
        )
        .where(PENDING_PREDICATE, *scope)
        .group_by(sc.source_site, sc.source_node, sc.status)
    )
    for row in conn.execute(pending):
        figures = report.node((row.source_site, row.source_node))
        if row.status == SiteCallStatus.PARKED.value:
            figures.parked += row.calls
        elif row.status in _BUFFERED:
            figures.buffered += row.calls
            figures.stuck += row.old
            figures.add(KpiFigures(oldest_pending_created=row.oldest))
    finished = (
        sa.select(sc.source_site, sc.source_node, sc.status, sa.func.count().label("calls"))
        .where(
            sc.terminal_at_utc > now - interval,
            sc.terminal_at_utc <= now,
            sc.status.in_([SiteCallStatus.FAILED.value, SiteCallStatus.DELIVERED.value]),
            *scope,
        )
        .group_by(sc.source_site, sc.source_node, sc.status)
    )
    for row in conn.execute(finished):
        figures = report.node((row.source_site, row.source_node))
        if row.status == SiteCallStatus.FAILED.value:
            figures.failed_last_interval += row.calls
        else:
            figures.delivered_last_interval += row.calls
    return report
