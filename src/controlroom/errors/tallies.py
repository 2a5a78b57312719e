"""How many failed messages share a status, endpoint, host and message type: the counts
the database keeps (migration 0012), read as one consistent sum and kept small.

Source: docs/decisions.md "The database keeps the counts" — the summary (ServiceControl's
``FailedMessageFacetsIndex``) and the counts by status must equal the query-time aggregate over
``failed_messages`` at every committed state. The database's triggers count every change of a
message in the transaction that makes it, whatever code makes it. A key's count is its row in
``failed_message_tallies`` plus its rows in ``failed_message_tally_deltas`` (PostgreSQL's triggers
append deltas so that concurrent writers share no row); ``tally_rows`` reads both in one statement,
so a reader sees one committed state. Deltas are folded into the tallies
(``Provider.compact_tallies``) by the writer that made them once it has written
``FOLD_AFTER_MESSAGES`` failed messages, and by a reader that finds more than ``FOLD_AFTER_DELTAS``
of them, so a read sums at most a few thousand rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from controlroom.db.counts import connection_free_now
from controlroom.db.providers import provider_for
from controlroom.db.tables import failed_message_tallies, failed_message_tally_deltas
from controlroom.db.transactions import begin_write

log = logging.getLogger(__name__)

Conditions = Callable[[sa.ColumnCollection[str, Any]], Sequence[sa.ColumnElement[bool]]]

FOLD_AFTER_DELTAS = 2_000
"""A reader folds the deltas first when there are more than this many (one statement of
a few milliseconds), so what it sums stays small."""

FOLD_AFTER_MESSAGES = 2_000
"""A writer folds the deltas after every this many failed messages it wrote: about one
delta row per new message (a 50-row upsert spans many keys), so a busy writer keeps them
near this bound without a reader."""

KEY = tuple(c.name for c in failed_message_tallies.c if c.name != "messages")
"""The tallies' key columns, all ``failed_messages`` columns of the same names."""


def tally_rows(where: Conditions | None = None) -> sa.CompoundSelect[Any]:
    """Rows of (the ``KEY`` columns, ``messages``): tallies and deltas together, each
    filtered by ``where`` (given a table's columns, the conditions to AND); sum
    ``messages`` per key or any part of it. Keys may repeat, and a sum may be 0 (a key
    whose messages all moved away). Use it as a subquery or a CTE."""
    columns = [*KEY, "messages"]
    return sa.union_all(
        *(
            sa.select(*(table.c[c] for c in columns)).where(*(where(table.c) if where else ()))
            for table in (failed_message_tallies, failed_message_tally_deltas)
        )
    )


def fold_deltas(engine: sa.Engine) -> bool:
    """Fold the committed deltas into the tallies, and the group counts' rows into one
    per key (``Provider.compact_group_counts``), in a transaction of their own; ``False``
    when another process was folding them. Store errors propagate."""
    if not provider_for(engine).keeps_tally_deltas:
        return True
    with begin_write(engine) as conn:
        provider = provider_for(conn)
        if not provider.compact_tallies(conn):
            return False
        provider.compact_group_counts(conn)  # the group counts' rows (migration 0014)
        return True


def fold_deltas_if_many(conn: sa.Connection) -> None:
    """Fold the deltas (``fold_deltas``, another connection of ``conn``'s engine) when
    more than ``FOLD_AFTER_DELTAS`` wait and a connection is free now
    (``db.counts.connection_free_now``): a read never waits for the pool to fold, it leaves the
    deltas to a later fold. A failure to fold is logged, the read goes on (the sum it
    reads is exact either way, only slower)."""
    if not provider_for(conn).keeps_tally_deltas:
        return
    waiting = sa.select(sa.literal(1)).select_from(failed_message_tally_deltas)
    count = sa.select(sa.func.count()).select_from(waiting.limit(FOLD_AFTER_DELTAS + 1).subquery())
    if conn.execute(count).scalar_one() <= FOLD_AFTER_DELTAS:
        return
    if not connection_free_now(conn.engine):
        log.debug("no free connection to fold the tally deltas; a later fold takes them")
        return
    try:
        fold_deltas(conn.engine)
    except (sa.exc.DBAPIError, sa.exc.TimeoutError):  # TimeoutError: the pool is exhausted
        log.warning("folding the tally deltas failed; reading them unfolded", exc_info=True)
