"""What every provider's retry-batch SQL offers: insert-if-absent claims."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from controlroom.db.tables import failed_message_retries

MAX_CLAIMS_PER_STATEMENT = 1000
"""Claims per insert statement: a whole retry batch (3 parameters a row stays far under
every provider's limit on bound parameters)."""


@dataclass(frozen=True)
class RetryBatchDialect:
    """Retry-batch SQL for a provider whose ``insert()`` has ``on_conflict_do_nothing``.

    ``insert`` is the provider's own construct (``sqlalchemy.dialects.<name>.insert``).
    """

    name: str
    insert: Callable[[sa.Table], Any]

    def claim_messages(
        self, conn: sa.Connection, retry_batch_id: str, failed_message_ids: Sequence[str]
    ) -> list[str]:
        """Claim ``failed_message_ids`` for batch ``retry_batch_id``; return those claimed.

        One set-based insert-if-absent per ``MAX_CLAIMS_PER_STATEMENT`` ids, keyed on
        ``failed_message_retries.failed_message_id``: an id already claimed (by any batch,
        committed or not) is left alone, so a message is in at most one batch even when
        two requests claim overlapping sets at once. On PostgreSQL the second claimer of
        an id waits for the first transaction and then skips it (or claims it, when the
        first rolled back). Ids are inserted in sorted order, the lock order that keeps
        two claimers of overlapping sets from deadlocking. Returns the claimed ids, sorted.
        """
        ids = sorted(set(failed_message_ids))
        claimed: list[str] = []
        for start in range(0, len(ids), MAX_CLAIMS_PER_STATEMENT):
            chunk = ids[start : start + MAX_CLAIMS_PER_STATEMENT]
            claimed.extend(conn.execute(self.claim_statement(retry_batch_id, chunk)).scalars())
        return sorted(claimed)

    def claim_statement(self, retry_batch_id: str, failed_message_ids: Sequence[str]) -> Any:
        """``INSERT ... ON CONFLICT (failed_message_id) DO NOTHING RETURNING
        failed_message_id`` of the given ids (in the given order) for one batch."""
        key = failed_message_retries.c.failed_message_id
        rows = [
            {"failed_message_id": i, "retry_batch_id": retry_batch_id, "stage_attempts": 0}
            for i in failed_message_ids
        ]
        return (
            self.insert(failed_message_retries)
            .values(rows)
            .on_conflict_do_nothing(index_elements=[key])
            .returning(key)
        )
