"""Keeping the group counts small: ``failed_message_group_counts`` folded in the background.

On PostgreSQL the triggers of migration 0014 append a row per statement and key (so
concurrent writers never wait on a shared counter); every row a reader sums costs it a
little, so ``serve`` folds them to one row per key every ``interval_seconds``. Folding
never changes a sum, so it needs no lease: several processes may fold at once.
"""

from __future__ import annotations

import asyncio
import logging

import sqlalchemy as sa

from controlroom.db.providers import provider_for
from controlroom.db.transactions import begin_write

log = logging.getLogger(__name__)

COMPACTION_INTERVAL_SECONDS = 5.0
"""How often ``serve`` folds the group counts: at full ingestion speed a few thousand
rows accumulate in between, a millisecond or two of summing for a groups view."""


def compact_group_counts(engine: sa.Engine) -> None:
    """Fold the group counts to one row per (classifier, group, status), in one
    transaction (``Provider.compact_group_counts``)."""
    with begin_write(engine) as conn:
        provider_for(conn).compact_group_counts(conn)


class GroupCountCompactor:
    """Background task: ``compact_group_counts`` every ``interval_seconds`` until
    cancelled; a failed pass is logged and the schedule goes on."""

    def __init__(
        self, engine: sa.Engine, *, interval_seconds: float = COMPACTION_INTERVAL_SECONDS
    ) -> None:
        self._engine = engine
        self._interval = interval_seconds

    async def run(self) -> None:
        """Fold until cancelled."""
        while True:
            try:
                await asyncio.shield(asyncio.to_thread(compact_group_counts, self._engine))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("folding the group counts failed; next in %.0f s", self._interval)
            await asyncio.sleep(self._interval)
