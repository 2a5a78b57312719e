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

Two statements answer every scope at once. The non-terminal calls are read from the
counts the database keeps per (site, node, status) (``site_call_counts``, migration 0028;
docs/decisions.md "The database keeps the counts"), and per buffered key two probes of the
partial index ``ix_site_calls_pending`` of migration 0005 (its predicate is repeated here
word for word, so both providers recognise it): the key's oldest call, and its calls
created since ``now - stuck_threshold`` (the stuck ones are the others). So a reading costs
the same whatever the backlog: it grows with the keys and the recent calls. Terminal calls
come from ``ix_site_calls_terminal`` by terminal time. The scopes are sums of the per-node
figures (``db.kpi_history.KpiFigures``, the shape the notification outbox's KPIs share).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from typing import Any

import sqlalchemy as sa

from controlroom.db.counts import fold_counts_when_free
from controlroom.db.kpi_history import KpiFigures
from controlroom.db.tables import site_call_counts, site_calls
from controlroom.telemetry.ordering import BUFFERED, SiteCallStatus

sc = site_calls.c
counts = site_call_counts.c

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


FOLD_AFTER_ROWS = 2_000
"""A reading folds the counts after it when ``site_call_counts`` holds more than this many
rows (PostgreSQL appends one per write statement and key), so what the next sums stays
small."""


def _per_key(
    key: sa.Subquery, select: sa.Select[Any], *conditions: sa.ColumnElement[bool]
) -> sa.ColumnElement[Any]:
    """``select`` over the pending calls of ``key``'s row (site, node, status) that meet
    ``conditions``: a probe of ``ix_site_calls_pending`` by its three leading columns. A
    NULL node is matched by ``IS NULL`` (an index condition on both providers), any other
    by ``=``."""
    same: list[Any] = [
        PENDING_PREDICATE,
        sc.source_site == key.c.source_site,
        sc.status == key.c.status,
    ]
    with_node = select.where(*same, sc.source_node == key.c.source_node, *conditions)
    without_node = select.where(*same, sc.source_node.is_(None), *conditions)
    return sa.case(
        (key.c.source_node.is_(None), without_node.scalar_subquery()),
        else_=with_node.scalar_subquery(),
    )


@cache
def _pending_statement(by_site: bool, by_node: bool) -> sa.Select[Any]:
    """The statement of the non-terminal figures, built once per scope's shape (bound
    parameters ``stuck_before``, ``site``, ``node``): per node, its Parked and buffered
    calls, its oldest buffered call and its buffered calls created since
    ``stuck_before`` (from each buffered key's probes); with every row, how many rows the
    counts table holds (``stored``)."""
    counted: list[sa.ColumnElement[bool]] = []
    if by_site:
        counted.append(counts.source_site == sa.bindparam("site"))
    if by_node:
        counted.append(counts.source_node == sa.bindparam("node"))
    key = (
        sa.select(
            counts.source_site,
            counts.source_node,
            counts.status,
            sa.func.sum(counts.n).label("calls"),
        )
        .where(*counted)
        .group_by(counts.source_site, counts.source_node, counts.status)
        .subquery("counted")
    )
    buffered = key.c.status.in_(sorted(_BUFFERED))
    oldest = sa.select(sc.created_at_utc).order_by(sc.created_at_utc).limit(1)
    recent = sa.select(sa.func.count())
    since = sc.created_at_utc >= sa.bindparam("stuck_before", type_=sc.created_at_utc.type)
    per_key = (
        sa.select(
            key.c.source_site,
            key.c.source_node,
            sa.case((key.c.status == SiteCallStatus.PARKED.value, key.c.calls)).label("parked"),
            sa.case((buffered, key.c.calls)).label("buffered"),
            sa.case((buffered, _per_key(key, oldest))).label("oldest"),
            sa.case((buffered, _per_key(key, recent, since))).label("recent"),
        )
        .where(key.c.calls != 0)
        .subquery("per_key")
    )
    stored = sa.select(sa.func.count()).select_from(site_call_counts).scalar_subquery()
    return sa.select(
        per_key.c.source_site,
        per_key.c.source_node,
        sa.func.coalesce(sa.func.sum(per_key.c.parked), 0).label("parked"),
        sa.func.coalesce(sa.func.sum(per_key.c.buffered), 0).label("buffered"),
        sa.func.min(per_key.c.oldest).label("oldest"),
        sa.func.coalesce(sa.func.sum(per_key.c.recent), 0).label("recent"),
        stored.label("stored"),
    ).group_by(per_key.c.source_site, per_key.c.source_node)


def measure_kpis(
    conn: sa.Connection,
    *,
    now: datetime,
    interval: timedelta,
    stuck_threshold: timedelta,
    site: str | None = None,
    node: str | None = None,
) -> KpiReport:
    """The KPIs at ``now`` of every node, optionally only of ``site`` (and ``node``).

    Reads the counts the database keeps (``site_call_counts``), and per buffered key two
    probes of ``ix_site_calls_pending``: its oldest call, and its calls created since
    ``now - stuck_threshold`` (stuck are the others). Its work grows with the keys and the
    recent calls, not with the backlog. When the counts table holds more than
    ``FOLD_AFTER_ROWS`` rows, they are folded afterwards on another connection if one is
    free (``db.counts.fold_counts_when_free``), for the next reading."""
    scope: list[sa.ColumnElement[bool]] = []
    if site is not None:
        scope.append(sc.source_site == site)
    if node is not None:
        scope.append(sc.source_node == node)
    report = KpiReport(now=now)
    parameters = {"stuck_before": now - stuck_threshold, "site": site, "node": node}
    stored = 0
    pending = _pending_statement(site is not None, node is not None)
    for row in conn.execute(pending, parameters):
        stored = row.stored
        figures = report.node((row.source_site, row.source_node))
        figures.parked += int(row.parked)
        figures.buffered += int(row.buffered)
        figures.stuck += int(row.buffered) - int(row.recent)
        if row.oldest is not None:
            figures.add(KpiFigures(oldest_pending_created=row.oldest))
    if stored > FOLD_AFTER_ROWS:
        fold_counts_when_free(conn.engine, site_call_counts)
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
