"""Any key the write path accepts can be folded (migration 0015).

A failed message whose receiving endpoint, host id, host and message type are each
within their column but together longer than a btree index row (2,704 bytes on
PostgreSQL) made every fold of the tally deltas fail on 0012's unique index over the
key: the counts stayed exact, but the delta and group-count rows grew forever. On every
provider: ingest such messages through parsing and the real writer, fold, and find the
counts exact and nothing left to fold.
"""

from __future__ import annotations

import random

import sqlalchemy as sa

from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_group_counts,
    failed_message_tallies,
    failed_message_tally_deltas,
)
from controlroom.errors import tallies
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.read.counts import count_by_status
from tests.integration.test_tallies import NOW, full_aggregate, tallied


def four_byte_text(rng: random.Random, characters: int) -> str:
    """``characters`` random characters of four UTF-8 bytes each (no compression helps)."""
    return "".join(chr(rng.randrange(0x10000, 0x2FFFF)) for _ in range(characters))


def long_key_headers(n: int, rng: random.Random) -> dict[str, str]:
    """Headers of failed message ``n``: endpoint and host of 400 characters, host id of
    100 (their columns' limits) and a message type of 400, 4 bytes each: 5,200 bytes."""
    endpoint = four_byte_text(rng, 400)
    return {
        h.MESSAGE_ID: f"long-{n}",
        h.FAILED_Q: "queue",
        h.PROCESSING_ENDPOINT: endpoint,
        h.HOST_ID: four_byte_text(rng, 100),
        h.HOST_DISPLAY_NAME: four_byte_text(rng, 400),
        h.ENCLOSED_MESSAGE_TYPES: four_byte_text(rng, 400),
        h.EXCEPTION_TYPE: "System.Exception",
        h.EXCEPTION_MESSAGE: "boom",
    }


def test_a_key_longer_than_an_index_row_is_folded(engine: sa.Engine) -> None:
    rng = random.Random(15)
    writer = FailedMessageBatchWriter(engine, clock=lambda: NOW)
    messages = [
        parse_failed_message(long_key_headers(n, rng), b"{}", max_body_size_to_store=1024)
        for n in range(3)
    ]
    # Messages 0 and 1 share a key: the second fold adds to the tally the first made.
    messages[1] = parse_failed_message(
        {**long_key_headers(0, random.Random(15)), h.MESSAGE_ID: "long-1"},
        b"{}",
        max_body_size_to_store=1024,
    )
    writer.write(IngestionBatch(attempts=messages[:1]))
    assert tallies.fold_deltas(engine)
    writer.write(IngestionBatch(attempts=messages[1:]))
    assert tallies.fold_deltas(engine)
    with engine.connect() as conn:
        assert tallied(conn) == full_aggregate(conn)
        stored = conn.execute(sa.select(failed_message_tallies.c.messages)).scalars()
        assert sorted(stored) == [1, 2]  # one row per key
        waiting = sa.select(sa.func.count()).select_from(failed_message_tally_deltas)
        assert conn.execute(waiting).scalar_one() == 0
        counts = failed_message_group_counts.c
        group_rows = conn.execute(sa.select(counts.classifier, counts.group_id, counts.status))
        keys = [tuple(row) for row in group_rows]
        assert len(keys) == len(set(keys))  # one row per key: folded
        assert count_by_status(conn)[FailedMessageStatus.UNRESOLVED] == 3
