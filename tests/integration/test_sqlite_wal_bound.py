"""SQLite's write-ahead log stays bounded while reads overlap every commit
(docs/decisions.md "SQLite's write-ahead log is checkpointed by the writer").

SQLite's automatic checkpoint is passive: while some read transaction began before the
latest commit, it cannot copy the newest frames back, and the log only starts over once
every frame was copied with no reader left in it. A console read during a drain is
such a reader, so without the writer's own checkpoint the log grew by every batch."""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from controlroom.db.engine import begin_write, create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.providers import sqlite as sqlite_provider
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from tests.nsb import failed_headers

BOUND = 256 * 1024  # bytes: small, so that every batch of this test passes it


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[sa.Engine, Path]]:
    monkeypatch.setattr(sqlite_provider, "WAL_CHECKPOINT_BYTES", BOUND)
    path = tmp_path / "controlroom.db"
    engine = create_store_engine(f"sqlite:///{path}")
    upgrade_database(engine)
    try:
        yield engine, Path(f"{path}-wal")
    finally:
        engine.dispose()


def overlapping_reads(engine: sa.Engine, stop: threading.Event, started: threading.Event) -> None:
    """Read transactions that stay open a while, as a console's page does."""
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT count(*) FROM failed_messages")).scalar_one()
        started.set()
    while not stop.is_set():
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT count(*) FROM failed_message_groups")).scalar_one()
            time.sleep(0.005)
            conn.execute(sa.text("SELECT count(*) FROM failed_messages")).scalar_one()


def batch(start: int, count: int) -> IngestionBatch:
    return IngestionBatch(
        attempts=[
            parse_failed_message(
                failed_headers(f"wal-{n}", exception_message=f"failure {n} " + "x" * 2000),
                b'{"n": 1}',
                max_body_size_to_store=100_000,
            )
            for n in range(start, start + count)
        ]
    )


def test_the_log_stays_within_its_bound_while_reads_overlap_every_commit(
    store: tuple[sa.Engine, Path],
) -> None:
    engine, wal = store
    writer = FailedMessageBatchWriter(engine)
    stop, started = threading.Event(), threading.Event()
    readers = [
        threading.Thread(target=overlapping_reads, args=(engine, stop, started)) for _ in range(2)
    ]
    for reader in readers:
        reader.start()
    started.wait(10)
    sizes = []
    try:
        for n in range(12):
            writer.write(batch(n * 100, 100))
            sizes.append(wal.stat().st_size)
    finally:
        stop.set()
        for reader in readers:
            reader.join()

    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM failed_messages")).scalar_one() == 1200
    # After each write the writer has checkpointed a log past the bound and truncated it.
    assert max(sizes) <= BOUND, sizes


def test_a_log_past_its_bound_is_checkpointed_only_by_a_writer(
    store: tuple[sa.Engine, Path],
) -> None:
    engine, wal = store
    FailedMessageBatchWriter(engine).write(batch(0, 100))
    assert wal.stat().st_size <= BOUND
    with engine.begin() as conn:  # a write that is not a writer's (no BEGIN IMMEDIATE) ...
        conn.execute(sa.text("CREATE TABLE scratch (x BLOB)"))
        conn.execute(sa.text("INSERT INTO scratch VALUES (zeroblob(1048576))"))
    # ... and reads leave the log as it is: only a writer's commit pays the checkpoint.
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT count(*) FROM scratch")).scalar_one()
    assert wal.stat().st_size > BOUND


def test_two_writers_of_one_process_leave_each_others_checkpoints_alone(
    store: tuple[sa.Engine, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint that truncates waits for every writer as well as the reads: two
    batches written at once (an intake's concurrent batches, the telemetry intake beside
    the error queue's) held up each other's checkpoints for their whole wait, and the log
    grew past its bound by every batch (fresh user, session 32: 338 MB, 215 checkpoints
    given up in one drain). A process's writers take turns with the checkpoint that
    follows each commit."""
    engine, wal = store
    caplog.set_level(logging.INFO, logger=sqlite_provider.__name__)
    writer = FailedMessageBatchWriter(engine)
    barrier = threading.Barrier(2)
    sizes: list[int] = []

    def write(first: int) -> None:
        barrier.wait(10)
        for n in range(6):
            writer.write(batch(first + n * 100, 100))
            sizes.append(wal.stat().st_size)

    threads = [threading.Thread(target=write, args=(start,)) for start in (0, 10_000)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM failed_messages")).scalar_one() == 1200
    given_up = [r.getMessage() for r in caplog.records if "left the log" in r.getMessage()]
    assert not given_up, given_up


def _write_in_a_process(
    path: Path, first: int, barrier: Any, results: Any
) -> None:  # pragma: no cover - runs in a spawned process
    """One intake worker's writes: six batches of 100 after ``barrier``; puts the lines
    of its checkpoints given up on ``results``."""
    sqlite_provider.WAL_CHECKPOINT_BYTES = BOUND
    given_up: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "left the log" in record.getMessage():
                given_up.append(record.getMessage())

    provider_log = logging.getLogger(sqlite_provider.__name__)
    provider_log.addHandler(Lines())
    provider_log.setLevel(logging.INFO)
    engine = create_store_engine(f"sqlite:///{path}")
    writer = FailedMessageBatchWriter(engine)
    barrier.wait(30)
    for n in range(6):
        writer.write(batch(first + n * 100, 100))
    engine.dispose()
    results.put(given_up)


def test_two_processes_writing_one_store_leave_each_others_checkpoints_alone(
    store: tuple[sa.Engine, Path],
) -> None:
    """Breaker's pass (session 32): with ``ingestion.workers = 2`` on SQLite the writers'
    turn was per process, and two workers held up each other's checkpoints (the log at
    145 MB, bound 64 MiB). The turn is taken across processes too."""
    engine, wal = store
    path = wal.with_name(wal.name.removesuffix("-wal"))
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    processes = [
        context.Process(target=_write_in_a_process, args=(path, first, barrier, results))
        for first in (0, 10_000)
    ]
    for process in processes:
        process.start()
    given_up = [line for _ in processes for line in results.get(timeout=120)]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0

    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM failed_messages")).scalar_one() == 1200
    assert not given_up, given_up


def test_a_writer_that_waited_for_its_turn_waits_on_the_store_only_what_is_left(
    store: tuple[sa.Engine, Path],
) -> None:
    """Breaker's pass (session 32): with the store locked by another process, each write
    of a stop waited its turn and then a whole busy timeout, one after the other, so a
    stop took minutes. A writer that waited for its turn is left only the rest of the busy
    timeout to wait on the store."""
    engine, _ = store
    holding = threading.Event()
    seen: list[int] = []

    def long_write() -> None:
        with begin_write(engine) as conn:
            conn.execute(sa.text("SELECT 1")).scalar_one()
            holding.set()
            time.sleep(1.0)  # holds the turn while the other writer begins

    def waiting_write() -> None:
        with begin_write(engine) as conn:
            seen.append(conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one())

    first = threading.Thread(target=long_write)
    first.start()
    assert holding.wait(10)
    waiting_write()
    first.join()
    (busy_ms,) = seen
    assert busy_ms < sqlite_provider.BUSY_TIMEOUT_SECONDS * 1000
    # Its connection waits a whole busy timeout again in its next transaction.
    with begin_write(engine) as conn:
        busy_again = conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one()
    assert busy_again == sqlite_provider.BUSY_TIMEOUT_SECONDS * 1000
