"""Concurrent writers on PostgreSQL (docs/design.md: safe against concurrent writers)."""

from __future__ import annotations

import multiprocessing
import random
from collections import Counter

import sqlalchemy as sa

from controlroom.db.engine import create_store_engine, retry_transient
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import failed_message_groups, failed_messages
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from tests.factories import at, attempt, message_uuid

WRITERS = 8
MESSAGES = 200
BATCHES_PER_WRITER = 5


def writer_plan(writer: int) -> list[list[tuple[int, float]]]:
    """Batches of (message, failure second) for one writer: every id, distinct attempts."""
    rng = random.Random(writer)
    batches = []
    for batch in range(BATCHES_PER_WRITER):
        ids = rng.sample(range(MESSAGES), k=120)
        batches.append([(n, writer * 1000 + batch * 10 + n / 1000) for n in ids])
    return batches


def run_writer(url: str, writer: int, barrier: multiprocessing.synchronize.Barrier) -> None:
    engine = create_store_engine(url)
    batch_writer = FailedMessageBatchWriter(
        engine, retrying=retry_transient(max_backoff_seconds=0.5)
    )
    barrier.wait(timeout=60)
    for batch in writer_plan(writer):
        batch_writer.write(IngestionBatch(attempts=[attempt(n, at(s)) for n, s in batch]))
    engine.dispose()


def test_eight_process_writers_overlapping_ids_count_every_distinct_attempt(
    postgresql_url: str,
) -> None:
    engine = create_store_engine(postgresql_url)
    upgrade_database(engine)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(WRITERS)
    processes = [
        context.Process(target=run_writer, args=(postgresql_url, w, barrier))
        for w in range(WRITERS)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=240)
    assert [p.exitcode for p in processes] == [0] * WRITERS

    expected = Counter(n for w in range(WRITERS) for batch in writer_plan(w) for n, _ in batch)
    newest = {}
    for w in range(WRITERS):
        for batch in writer_plan(w):
            for n, s in batch:
                newest[n] = max(newest.get(n, s), s)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(failed_messages)).all()
        group_rows = conn.execute(
            sa.select(failed_message_groups.c.failed_message_id, failed_message_groups.c.title)
        ).all()
    engine.dispose()

    assert {row.id: row.number_of_processing_attempts for row in rows} == {
        message_uuid(n): count for n, count in expected.items()
    }
    assert {row.id: row.last_failure_at for row in rows} == {
        message_uuid(n): at(s) for n, s in newest.items()
    }
    assert all(
        row.exception_message == attempt(0, row.last_failure_at).exception_message for row in rows
    )
    # Exactly the group of each message's stored attempt: a writer whose insert of a new
    # id became an update of another writer's row replaced that writer's group rows
    # (docs/decisions.md "The upsert says which rows it inserted").
    assert sorted(group_rows) == sorted((row.id, row.exception_message) for row in rows)
