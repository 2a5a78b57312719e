"""The monotonic, INSERT-first upsert of ``site_calls``: our guard, the provider's construct.

Source: docs/design.md "Monotonic upsert"; docs/decisions.md "The site-call upsert inserts
first". One statement inserts
the row when its id is absent and otherwise applies the monotonic update, so the insert
is gated on the row's existence alone — never on "the update matched nothing", which
loses the loser's state when two writers race the first packet of an id. Two inserters of
one new id never fault: the database turns the loser's insert into the guarded update
(``ON CONFLICT ... DO UPDATE ... WHERE``), which reads the row the winner committed.

The guard is ``controlroom.telemetry.ordering.supersedes`` in SQL; it reads the stored,
pre-update row (the table's columns) against the incoming one. It also holds a call to the
site that reported it first (``contract.foreign_source``): a packet naming another
``source_site`` never updates the row, even one racing past the writer's owner check.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import sqlalchemy as sa

from controlroom.db.providers import Provider, Row
from controlroom.db.tables import site_calls
from controlroom.telemetry.ordering import RANKS, TERMINAL_RANK

stored = site_calls.c

# Every column the incoming state replaces when it wins (the key stays).
UPDATED_COLUMNS: tuple[str, ...] = tuple(
    column.name for column in site_calls.columns if column.name != "tracked_operation_id"
)


def status_rank(status: sa.ColumnElement[Any]) -> sa.ColumnElement[int]:
    """The rank of a status column in SQL (``ordering.RANKS``); NULL for an unknown one."""
    return sa.case({s.value: r for s, r in RANKS.items()}, value=status)


def supersedes_stored(incoming: Any) -> sa.ColumnElement[bool]:
    """True where the incoming row replaces the stored one (``ordering.supersedes``)."""
    incoming_rank, stored_rank = status_rank(incoming.status), status_rank(stored.status)
    same_epoch = incoming.epoch == stored.epoch
    return sa.or_(
        incoming.epoch > stored.epoch,
        sa.and_(same_epoch, incoming_rank > stored_rank),
        sa.and_(
            same_epoch,
            incoming_rank == stored_rank,
            stored_rank < TERMINAL_RANK,  # an equal terminal rank is immutable
            # updated_at_utc, then its 100 ns (telemetry.stamps): the newer stamp wins.
            sa.tuple_(incoming.updated_at_utc, incoming.updated_at_tick)
            > sa.tuple_(stored.updated_at_utc, stored.updated_at_tick),
        ),
    )


def same_source(incoming: Any) -> sa.ColumnElement[bool]:
    """True where the incoming row names the stored row's site (``contract.foreign_source``)."""
    same: sa.ColumnElement[bool] = incoming.source_site == stored.source_site
    return same


def stored_owners(conn: sa.Connection, ids: Sequence[str]) -> dict[str, str]:
    """The ``source_site`` of each stored call among ``ids`` (at most
    ``max_ids_per_in_list``); absent ids are not in the answer."""
    if not ids:
        return {}
    query = sa.select(stored.tracked_operation_id, stored.source_site).where(
        stored.tracked_operation_id.in_(list(ids))
    )
    return {row.tracked_operation_id: row.source_site for row in conn.execute(query)}


def _assignments(incoming: Any) -> dict[str, sa.ColumnElement[Any]]:
    return {name: getattr(incoming, name) for name in UPDATED_COLUMNS}


@cache
def upsert_statement(provider: Provider) -> Any:
    """The monotonic upsert on ``provider``, built once (one compiled shape for every
    chunk). Returns the ids of the rows it inserted or updated; a packet the guard
    refused returns nothing."""
    return provider.upsert(
        site_calls,
        key=[stored.tracked_operation_id],
        set_=_assignments,
        where=lambda incoming: sa.and_(same_source(incoming), supersedes_stored(incoming)),
        returning=[stored.tracked_operation_id],
    )


def upsert_site_calls(conn: sa.Connection, provider: Provider, rows: Sequence[Row]) -> set[str]:
    """Apply ``rows`` (one per id, sorted by id so concurrent writers lock in one order)
    as multi-row statements of at most ``provider.max_rows_per_statement`` rows.

    Returns the ids whose stored row is now the incoming one.
    """
    if not rows:
        return set()
    result = conn.execute(
        upsert_statement(provider), list(rows), execution_options=provider.executemany_options()
    )
    return set(result.scalars().all())
