"""Folding the signed counts the database keeps (docs/decisions.md "The database keeps the
counts"): tables of key columns and ``n`` whose rows PostgreSQL's statement triggers
append, one per statement and key, and ``Provider.compact_counts`` folds to one per key.
A fold changes no key's sum; it keeps what a reader sums small.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa

from controlroom.db.providers import provider_for
from controlroom.db.transactions import begin_write

log = logging.getLogger(__name__)


def fold_counts(engine: sa.Engine, table: sa.Table) -> None:
    """Fold ``table``'s counts in a transaction of their own (nothing to do where the
    triggers keep one row per key). Store errors propagate."""
    if not provider_for(engine).keeps_tally_deltas:
        return
    with begin_write(engine) as conn:
        provider_for(conn).compact_counts(conn, table)


def fold_counts_when_free(engine: sa.Engine, table: sa.Table) -> None:
    """Fold ``table``'s counts (``fold_counts``) when a connection of ``engine`` is free
    now (``connection_free_now``): a read never waits for the pool to fold, it leaves
    the rows to a later fold. A failure to fold is logged, the read goes on (its sum is
    exact either way, only slower)."""
    if not connection_free_now(engine):
        log.debug("no free connection to fold %s; a later fold takes them", table.name)
        return
    try:
        fold_counts(engine, table)
    except (sa.exc.DBAPIError, sa.exc.TimeoutError):  # TimeoutError: the pool is exhausted
        log.warning("folding %s failed; reading it unfolded", table.name, exc_info=True)


def connection_free_now(engine: sa.Engine) -> bool:
    """Whether a checkout from ``engine``'s pool would not wait: a ``QueuePool`` holds an
    idle connection, or has opened fewer than its size (``overflow()`` counts up from
    minus the size), so it opens one. A pool busy beyond its size counts as not free, even
    with overflow left: a fold can wait for a quieter moment. Other pools never wait.
    Only a checkout racing others for the very last connections between this check and
    the fold's can still wait."""
    pool = engine.pool
    if not isinstance(pool, sa.pool.QueuePool):
        return True
    return pool.checkedin() > 0 or pool.overflow() < 0
