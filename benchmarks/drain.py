"""Sustained drain: what a long run of the write path leaves in the tables it rewrites.

The counter tables the database keeps beside the failed messages (migrations 0012 and
0014: ``failed_message_tally_deltas`` appended and deleted, ``failed_message_tallies``
updated, ``failed_message_group_counts`` appended and folded) turn over far more rows
than they hold. Whether they stay small depends on the server's autovacuum, so this
script prints it (``pgserver.describe_server``) with every figure, and runs on the admin
URL's server or, with ``--scratch-server``, on a PostgreSQL of its own with autovacuum on
(``pgserver.scratch_server``).

What it does: on a scratch database migrated to head, writes ``--messages`` failed
messages (``ingest.py``'s generator, a new seed per chunk of ``--chunk``, 10 % later
attempts) through the service's writer (``FailedMessageBatchWriter``, batches of the
production size, ``concurrent_batches`` threads, folding the deltas as serve does), and
after every chunk prints the rate and, per table, live and dead rows
(``pg_stat_user_tables``), size and autovacuum runs; at the end the same after the
writers disconnected. Parsing is outside the timed part. The database is dropped at the
end.

Run: ``.venv/bin/python benchmarks/drain.py --messages 200000`` (the machine's server),
``... --scratch-server`` (a scratch cluster, autovacuum on). Server:
``CONTROLROOM_BENCH_POSTGRESQL_URL`` (admin URL, as ``ingest.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from ingest import (
    ADMIN_URL_ENV,
    DEFAULT_ADMIN_URL,
    DEFAULT_REPEAT_SHARE,
    generate_messages,
    scratch_database,
    timed_parse,
    write_path,
)
from pgserver import add_server_arguments, admin_server, describe_server, format_table_state
from pgserver import table_state as drain_table_state

from controlroom.config import IngestionSettings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.errors.ingest.writer import FailedMessageBatchWriter

DEFAULT_MESSAGES = 1_000_000
DEFAULT_CHUNK = 20_000
STATS_FLUSH_SECONDS = 2.0
"""Backends flush their table statistics at most once a second: wait this long after the
writers disconnected before the final reading."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=DEFAULT_MESSAGES)
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="messages per reading")
    parser.add_argument("--repeat-share", type=float, default=DEFAULT_REPEAT_SHARE)
    parser.add_argument("--seed", type=int, default=2, help="seed of the first chunk")
    add_server_arguments(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ingestion = IngestionSettings()
    admin_url = os.environ.get(ADMIN_URL_ENV) or DEFAULT_ADMIN_URL
    with admin_server(args, admin_url) as admin, scratch_database(admin) as url:
        engine = create_store_engine(url, pool_size=max(2, ingestion.concurrent_batches))
        upgrade_database(engine)
        with engine.connect() as conn:
            print(f"PostgreSQL {describe_server(conn)}", flush=True)
        print(
            f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
            f"{args.messages:,} messages in chunks of {args.chunk:,}, batch size "
            f"{ingestion.batch_size}, {ingestion.concurrent_batches} batches at once",
            flush=True,
        )
        writer = FailedMessageBatchWriter(engine)  # one for the drain: it folds as serve's
        written, seconds = 0, 0.0
        chunk = 0
        while written < args.messages:
            count = min(args.chunk, args.messages - written)
            messages = generate_messages(
                count, repeat_share=args.repeat_share, seed=args.seed + chunk, now=datetime.now(UTC)
            )
            attempts, _ = timed_parse(messages)
            del messages
            started = time.perf_counter()
            write_path(
                engine,
                attempts,
                ingestion.batch_size,
                ingestion.concurrent_batches,
                lambda _engine: writer,
            )
            elapsed = time.perf_counter() - started
            written, seconds, chunk = written + count, seconds + elapsed, chunk + 1
            with engine.connect() as conn:
                states = {s.name: s for s in drain_table_state(conn)}
            print(
                f"{written:>9,} messages  {count / elapsed:6,.0f}/s  "
                + "  ".join(
                    f"{name.removeprefix('failed_message_')} {s.live:,}+{s.dead:,}d "
                    f"{s.bytes / 2**20:,.1f}MB"
                    for name, s in states.items()
                    if name != "failed_messages"
                ),
                flush=True,
            )
        engine.dispose()
        time.sleep(STATS_FLUSH_SECONDS)
        reader = sa.create_engine(url, poolclass=sa.pool.NullPool)
        with reader.connect() as conn:
            final = drain_table_state(conn)
            settings = describe_server(conn)
        reader.dispose()
    print(
        f"\n{written:,} messages in {seconds:,.0f} s of writing ({written / seconds:,.0f}/s); "
        f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )
    print(f"PostgreSQL {settings}")
    print("\n".join(format_table_state(final)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
