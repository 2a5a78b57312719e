"""The summary's facets: Unresolved failed messages counted by endpoint, host and
message type, from the tallies the database keeps; and the "Python task" facet, from the
counts of the ``Python Task Queue`` groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from controlroom.db.tables import FailedMessageStatus, failed_message_group_counts
from controlroom.errors import tallies
from controlroom.errors.ingest import identity
from controlroom.errors.ingest.grouping import PYTHON_TASK_QUEUE
from controlroom.errors.ingest.headers import TASK_QUEUE_KINDS
from controlroom.errors.read.counts import unresolved_tally_rows


@dataclass(frozen=True, slots=True)
class FacetValue:
    """One value of a facet and how many failed messages have it."""

    value: str
    count: int


@dataclass(frozen=True, slots=True)
class TaskQueueFacetValue:
    """Failed Python tasks of one task queue (``celery``, ``dramatiq``): how many are
    Unresolved, and the ``group_id`` that lists them (a list's group filter)."""

    value: str
    count: int
    group_id: str


FACETS = {
    "endpoint": "receiving_endpoint",
    "host": "receiving_host",
    "message_type": "message_type",
}
"""The summary's facets and the column each counts."""


def unresolved_facets(conn: sa.Connection) -> dict[str, list[FacetValue]]:
    """The Unresolved failed messages counted by receiving endpoint (``"endpoint"``), its
    host (``"host"``) and message type (``"message_type"``), most frequent first, then by
    value; messages without the value are not counted. Source: ServiceControl
    ``FailedMessageFacetsIndex``.

    One statement over the tallies (``errors.tallies``), so the three facets are of one
    committed state; grouping every Unresolved message took ~2 s at 1,000,000
    (docs/decisions.md "The database keeps the counts").
    """
    tallies.fold_deltas_if_many(conn)
    rows = unresolved_tally_rows().cte("unresolved")
    parts = []
    for facet, (name, column) in enumerate(FACETS.items()):
        count = sa.func.sum(rows.c.messages)
        parts.append(
            sa.select(
                sa.literal(facet).label("facet"),
                sa.literal(name).label("name"),
                rows.c[column].label("value"),
                count.label("n"),
            )
            .where(rows.c[column].is_not(None))
            .group_by(rows.c[column])
            .having(count > 0)
        )
    facets: dict[str, list[FacetValue]] = {name: [] for name in FACETS}
    ordered = sa.union_all(*parts).subquery("facets")
    for row in conn.execute(
        sa.select(ordered.c.name, ordered.c.value, ordered.c.n).order_by(
            ordered.c.facet, ordered.c.n.desc(), ordered.c.value
        )
    ):
        facets[row.name].append(FacetValue(value=row.value, count=int(row.n)))
    return facets


def python_task_facet(conn: sa.Connection) -> list[TaskQueueFacetValue]:
    """The failed Python tasks by task queue (``Controlroom.TaskQueue``): one value per
    task queue that has failed messages in any status, with its Unresolved count, most
    first, then by name; empty when there are none. Read from the ``Python Task Queue``
    groups' counts, which the database keeps (docs/decisions.md "The Python task facet is a
    classifier"): one statement over at most a few rows per task queue, whatever the number
    of messages."""
    ids = {identity.group_id(PYTHON_TASK_QUEUE, kind): kind for kind in TASK_QUEUE_KINDS}
    counts = failed_message_group_counts.c
    total = sa.cast(sa.func.sum(counts.n), sa.BigInteger)  # PostgreSQL: numeric otherwise
    rows = conn.execute(
        sa.select(counts.group_id, counts.status, total.label("n"))
        .where(counts.classifier == PYTHON_TASK_QUEUE, counts.group_id.in_(list(ids)))
        .group_by(counts.group_id, counts.status)
    )
    unresolved: dict[str, int] = {}
    for row in rows:
        if row.n > 0:
            present = unresolved.setdefault(row.group_id, 0)
            if row.status == int(FailedMessageStatus.UNRESOLVED):
                unresolved[row.group_id] = present + int(row.n)
    values = [TaskQueueFacetValue(ids[gid], n, gid) for gid, n in unresolved.items()]
    return sorted(values, key=lambda value: (-value.count, value.value))
