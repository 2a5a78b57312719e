"""Backend CPU of storing and reading the failed messages' large values compressed by pglz
and by lz4: COPY of the ``headers_json`` and search terms of the messages of
benchmarks/ingest.py into two unlogged tables differing only in their columns'
compression, in interleaved rounds (the order alternating), and a read of every value
back. The CPU is the backend's own (``/proc/<pid>/stat``), so the server must run on this
machine. Run from the repository's root:

    PYTHONPATH=src python benchmarks/toast_compression.py [--messages 5000] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).parent))

import ingest
from pgserver import add_url_argument, backend_cpu, tsvector_text

METHODS = ("pglz", "lz4")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=6)
    add_url_argument(parser)
    args = parser.parse_args()
    messages = ingest.generate_messages(
        args.messages, seed=1, now=datetime(2026, 12, 1, tzinfo=UTC)
    )
    rows = [(json.dumps(m.headers), tsvector_text(m.headers, m.body)) for m in messages]
    conn = psycopg.connect(args.url, autocommit=True)
    cpu = backend_cpu(conn)

    figures: dict[tuple[str, str], list[float]] = {}
    try:
        for method in METHODS:
            conn.execute(
                f"CREATE UNLOGGED TABLE bench_toast_{method} "
                f"(h text COMPRESSION {method}, v tsvector COMPRESSION {method})"
            )
        for round_ in range(args.rounds):
            for method in METHODS if round_ % 2 == 0 else METHODS[::-1]:
                conn.execute(f"TRUNCATE bench_toast_{method}")
                start = cpu()
                with conn.cursor().copy(f"COPY bench_toast_{method} (h, v) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                figures.setdefault(("COPY", method), []).append((cpu() - start) / len(rows) * 1e3)
                start = cpu()
                conn.execute(f"SELECT sum(length(h)), sum(length(v)) FROM bench_toast_{method}")
                figures.setdefault(("read", method), []).append((cpu() - start) / len(rows) * 1e3)
        for method in METHODS:
            sizes = conn.execute(
                "SELECT pg_size_pretty(pg_total_relation_size(%s::regclass)), "
                "avg(pg_column_size(h))::int, avg(pg_column_size(v))::int, "
                "avg(octet_length(h))::int "
                f"FROM bench_toast_{method}",
                (f"bench_toast_{method}",),
            ).fetchone()
            print(
                f"{method}: table {sizes[0]}, stored bytes per row: "  # type: ignore[index]
                f"headers {sizes[1]} (of {sizes[3]}), terms {sizes[2]}"  # type: ignore[index]
            )
        for (kind, method), values in figures.items():
            print(
                f"{kind:4} {method:4} median {statistics.median(values):.3f} ms backend CPU/row "
                f"({min(values):.3f}-{max(values):.3f})"
            )
    finally:
        for method in METHODS:
            conn.execute(f"DROP TABLE IF EXISTS bench_toast_{method}")


if __name__ == "__main__":
    main()
