"""The summary's facets: Unresolved failed messages counted by endpoint, host and
message type, from the tallies the database keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from controlroom.errors import tallies
from controlroom.errors.read.counts import unresolved_tally_rows


@dataclass(frozen=True, slots=True)
class FacetValue:
    """One value of a facet and how many failed messages have it."""

    value: str
    count: int


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
