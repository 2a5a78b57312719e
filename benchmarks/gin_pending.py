"""Backend CPU of maintaining the search index (GIN, ``fastupdate = on``) under
``gin_pending_list_limit`` of 4 MB (the server's default) and larger: the search terms of
the messages of benchmarks/ingest.py COPY'd into an unlogged table with a GIN index, in
transactions of 200 rows (the write path's batch), then ``gin_clean_pending_list`` (the
pending entries a larger list defers, counted), in interleaved rounds. Backend CPU from
``/proc/<pid>/stat`` (the server must run on this machine). From the repository's root:

    PYTHONPATH=src python benchmarks/gin_pending.py [--messages 10000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).parent))

import ingest
from pgserver import add_url_argument, backend_cpu, tsvector_text

LIMITS = ("4MB", "32MB", "128MB")
BATCH = 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=4)
    add_url_argument(parser)
    args = parser.parse_args()
    now = datetime(2026, 12, 1, tzinfo=UTC)
    messages = ingest.generate_messages(args.messages, seed=1, now=now)
    rows = [(tsvector_text(m.headers, m.body),) for m in messages]
    conn = psycopg.connect(args.url, autocommit=True)
    cpu = backend_cpu(conn)

    figures: dict[tuple[str, str], list[float]] = {}
    try:
        conn.execute("CREATE UNLOGGED TABLE bench_gin (v tsvector)")
        conn.execute("CREATE INDEX bench_gin_v ON bench_gin USING gin (v) WITH (fastupdate = on)")
        for round_ in range(args.rounds):
            order = LIMITS[round_ % len(LIMITS) :] + LIMITS[: round_ % len(LIMITS)]
            for limit in order:
                conn.execute("TRUNCATE bench_gin")
                conn.execute(f"SET gin_pending_list_limit = '{limit}'")
                start = cpu()
                for first in range(0, len(rows), BATCH):
                    with (
                        conn.transaction(),
                        conn.cursor().copy("COPY bench_gin (v) FROM STDIN") as copy,
                    ):
                        for row in rows[first : first + BATCH]:
                            copy.write_row(row)
                written = cpu()
                conn.execute("SELECT gin_clean_pending_list('bench_gin_v')")
                end = cpu()
                figures.setdefault(("rows", limit), []).append((written - start) / len(rows) * 1e3)
                figures.setdefault(("all", limit), []).append((end - start) / len(rows) * 1e3)
        for (kind, limit), values in figures.items():
            what = "while writing" if kind == "rows" else "with the pending list cleaned"
            print(
                f"{limit:5} {what:30} median {statistics.median(values):.3f} ms backend CPU/row "
                f"({min(values):.3f}-{max(values):.3f})"
            )
    finally:
        conn.execute("DROP TABLE IF EXISTS bench_gin")


if __name__ == "__main__":
    main()
