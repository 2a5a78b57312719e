"""Retry claims: a message is in at most one retry batch (insert-if-absent).

Source: docs/design.md "Data model" (``failed_message_retries``) and "Error instance:
retries"; docs/decisions.md "Retry requests claim messages in batches": a claim is a row keyed on
the failed message's id, inserted if absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from controlroom.db.providers import Provider, provider_for
from controlroom.db.tables import failed_message_retries

MAX_CLAIMS_PER_STATEMENT = 1000
"""Claims per insert statement: a whole retry batch (3 parameters a row stays far under
every provider's limit on bound parameters)."""


def claim_messages(
    conn: sa.Connection, retry_batch_id: str, failed_message_ids: Sequence[str]
) -> list[str]:
    """Claim ``failed_message_ids`` for batch ``retry_batch_id``; return those claimed.

    One set-based insert-if-absent per ``MAX_CLAIMS_PER_STATEMENT`` ids, keyed on
    ``failed_message_retries.failed_message_id``: an id already claimed (by any batch,
    committed or not) is left alone, so a message is in at most one batch even when two
    requests claim overlapping sets at once. A second claimer of an id waits for the
    first transaction and then skips it (or claims it, when the first rolled back). Ids
    are inserted in sorted order, the lock order that keeps two claimers of overlapping
    sets from deadlocking. Returns the claimed ids, sorted.
    """
    provider = provider_for(conn)
    ids = sorted(set(failed_message_ids))
    claimed: list[str] = []
    for start in range(0, len(ids), MAX_CLAIMS_PER_STATEMENT):
        chunk = ids[start : start + MAX_CLAIMS_PER_STATEMENT]
        claimed.extend(conn.execute(claim_statement(provider, retry_batch_id, chunk)).scalars())
    return sorted(claimed)


def claim_statement(
    provider: Provider, retry_batch_id: str, failed_message_ids: Sequence[str]
) -> Any:
    """``INSERT ... (if absent) RETURNING failed_message_id`` of the given ids (in the
    given order) for one batch."""
    key = failed_message_retries.c.failed_message_id
    rows = [
        {"failed_message_id": i, "retry_batch_id": retry_batch_id, "stage_attempts": 0}
        for i in failed_message_ids
    ]
    statement = provider.insert_if_absent(failed_message_retries, key=[key], returning=[key])
    return statement.values(rows)
