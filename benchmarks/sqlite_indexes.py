"""What SQLite's subset indexes of migrations 0032 and 0033 cost its write path
(docs/decisions.md "The read side may cost the write path at most a tenth").

Each round, for each schema revision (``--revisions``, default ``0031,0032,head``: before
0032's partial indexes of an endpoint's and a queue address's message type, before 0033's
fenced sorts' keys at the end of the subset indexes, and as migrated), a fresh SQLite
store in a scratch directory: the service's writer stores ``--messages`` of
``ingest.py``'s messages (its share of repeated attempts included, batches of 200, one
writer as SQLite's serve runs), then every message is archived and unarchived, 500 at a
time (``errors.read.operations``: a change of status and ``last_modified``, which 0033's
keys make rewrite those index entries). The revisions' order rotates each round; each is
timed by wall clock and this process's CPU (SQLite runs in it). Prints each measurement,
then per revision the median, and per round the ratio of its CPU per message to the first
revision's in the same round. Usage:

    .venv/bin/python benchmarks/sqlite_indexes.py --messages 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from ingest import MAX_BODY_SIZE_TO_STORE, chunks, generate_messages, ingestion_batch

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import failed_messages
from controlroom.db.transactions import begin_write
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.model import FailedAttempt
from controlroom.errors.read import operations


def timed(work: object) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of calling ``work``."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()  # type: ignore[operator]
    return time.perf_counter() - wall, time.process_time() - cpu


def run(directory: Path, revision: str, attempts: list[FailedAttempt]) -> dict[str, float]:
    """One revision's measurement in a fresh store: CPU and wall seconds of the writes and
    of the status changes."""
    path = directory / f"store-{revision}.db"
    engine = create_store_engine(f"sqlite:///{path}")
    upgrade_database(engine, revision)
    writer = FailedMessageBatchWriter(engine)
    batches = [ingestion_batch(batch) for batch in chunks(attempts, 200)]

    def write() -> None:
        for batch in batches:
            writer.write(batch)

    def archive_and_unarchive() -> None:
        with engine.connect() as conn:
            ids = list(conn.scalars(sa.select(failed_messages.c.id)))
        now = datetime.now(UTC)
        for part in chunks(ids, 500):
            with begin_write(engine) as conn:
                operations.archive_messages(conn, list(part), now)
        for part in chunks(ids, 500):
            with begin_write(engine) as conn:
                operations.unarchive_messages(conn, list(part), now)

    write_wall, write_cpu = timed(write)
    status_wall, status_cpu = timed(archive_and_unarchive)
    engine.dispose()
    for leftover in directory.iterdir():
        leftover.unlink()
    figures = {
        "write_rate": len(attempts) / write_wall,
        "write_cpu_ms": write_cpu * 1000 / len(attempts),
        "status_cpu_ms": status_cpu * 1000 / len(attempts),
        "status_wall": status_wall,
    }
    print(
        f"  {revision:>5}: write {figures['write_rate']:7,.0f} msg/s, "
        f"{figures['write_cpu_ms']:.3f} ms CPU/msg; archive+unarchive "
        f"{status_wall:5.1f} s, {figures['status_cpu_ms']:.3f} ms CPU/msg"
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--revisions", default="0031,0032,head")
    args = parser.parse_args()
    revisions = args.revisions.split(",")
    print(f"load average before: {os.getloadavg()}")
    messages = generate_messages(args.messages, now=datetime.now(UTC))
    attempts = [
        parse_failed_message(m.headers, m.body, max_body_size_to_store=MAX_BODY_SIZE_TO_STORE)
        for m in messages
    ]
    results: dict[str, list[dict[str, float]]] = {r: [] for r in revisions}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}")
            order = revisions[round_ % len(revisions) :] + revisions[: round_ % len(revisions)]
            for revision in order:
                results[revision].append(run(Path(scratch), revision, attempts))
    base = revisions[0]
    print("median per revision, and CPU per message / " + base + " per round:")
    for revision in revisions:
        rows = results[revision]
        line = f"  {revision:>5}: write {statistics.median(r['write_rate'] for r in rows):7,.0f}"
        line += f" msg/s {statistics.median(r['write_cpu_ms'] for r in rows):.3f} ms CPU/msg"
        line += f", status {statistics.median(r['status_cpu_ms'] for r in rows):.3f} ms CPU/msg"
        for key in ("write_cpu_ms", "status_cpu_ms"):
            ratios = [r[key] / b[key] for r, b in zip(rows, results[base], strict=True)]
            line += f"; {key.split('_')[0]} x{statistics.median(ratios):.2f} "
            line += f"({', '.join(f'{x:.2f}' for x in ratios)})"
        print(line)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
