"""SQLite's write-ahead log under a writer whose commits reads overlap (docs/decisions.md
"SQLite's write-ahead log is checkpointed by the writer").

Each round stores ``--messages`` of ``ingest.py``'s messages with the service's writer
(batches of 200) into a fresh SQLite store while two reader threads keep read
transactions open (two short statements 10 ms apart, back to back, as a console during
a drain), twice: as the service runs (the writer checkpoints a log past
``WAL_CHECKPOINT_BYTES``) and without the writer's checkpoint (SQLite's passive one only,
the service before 2026-12-05). Prints the log's size every tenth of the run, the write
rate and the reads' p50/p95, and the ratios of the same round. Usage:

    .venv/bin/python benchmarks/sqlite_wal.py --messages 20000 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from ingest import MAX_BODY_SIZE_TO_STORE, chunks, generate_messages, ingestion_batch

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.providers import sqlite as sqlite_provider
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.model import FailedAttempt


def read_loop(engine: sa.Engine, stop: threading.Event, seconds: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        with engine.connect() as conn:
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM (SELECT id FROM failed_messages "
                    "ORDER BY last_modified DESC LIMIT 2000)"
                )
            ).scalar_one()
            time.sleep(0.01)
            conn.execute(sa.text("SELECT count(*) FROM failed_message_groups")).scalar_one()
        seconds.append(time.perf_counter() - started)


def run(directory: Path, attempts: list[FailedAttempt], bound: int) -> dict[str, float]:
    sqlite_provider.WAL_CHECKPOINT_BYTES = bound
    path = directory / f"store-{bound}.db"
    engine = create_store_engine(f"sqlite:///{path}")
    upgrade_database(engine)
    writer = FailedMessageBatchWriter(engine)
    batches = [ingestion_batch(batch) for batch in chunks(attempts, 200)]
    stop, reads = threading.Event(), list[float]()
    readers = [threading.Thread(target=read_loop, args=(engine, stop, reads)) for _ in range(2)]
    for reader in readers:
        reader.start()
    sizes, started = [], time.perf_counter()
    for n, batch in enumerate(batches, 1):
        writer.write(batch)
        if n % max(1, len(batches) // 10) == 0:
            sizes.append(os.path.getsize(f"{path}-wal") / 2**20)
    elapsed = time.perf_counter() - started
    stop.set()
    for reader in readers:
        reader.join()
    engine.dispose()
    reads.sort()
    print(
        f"  {'writer checkpoints' if bound < 2**50 else 'passive only      '}: "
        f"{len(attempts) / elapsed:,.0f} msg/s, log MB per tenth "
        f"{[round(s) for s in sizes]}, largest {max(sizes):,.0f} MB, database "
        f"{path.stat().st_size / 2**20:,.0f} MB, reads p50 {reads[len(reads) // 2] * 1000:.1f} "
        f"p95 {reads[int(len(reads) * 0.95)] * 1000:.1f} ms ({len(reads):,})"
    )
    for leftover in directory.iterdir():
        leftover.unlink()
    return {"rate": len(attempts) / elapsed, "largest": max(sizes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    messages = generate_messages(args.messages, now=datetime.now(UTC))
    attempts = [
        parse_failed_message(m.headers, m.body, max_body_size_to_store=MAX_BODY_SIZE_TO_STORE)
        for m in messages
    ]
    bound, ratios = sqlite_provider.WAL_CHECKPOINT_BYTES, []
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}")
            order = [bound, 2**60] if round_ % 2 == 0 else [2**60, bound]
            figures = {b: run(Path(scratch), attempts, b) for b in order}
            ratios.append(figures[bound]["rate"] / figures[2**60]["rate"])
    print(
        f"write rate, writer checkpoints / passive only: median {statistics.median(ratios):.2f} "
        f"(rounds {', '.join(f'{r:.2f}' for r in ratios)}); load average after: {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
