"""What the group rows' copies of their message's columns cost the write path
(docs/decisions.md "The read side may cost the write path at most a tenth"):
the service's writer on schemas with and without them, measured back to back in one run.

Each variant is a schema revision and the writer that writes it, on a scratch database
of its own next to ``CONTROLROOM_BENCH_POSTGRESQL_URL`` (as ``ingest.py``):

- ``0010``: before migration 0011, no copies (the group rows without them);
- ``0011``: copies filled by 0011's insert trigger, a ``plpgsql`` call and a lookup of
  the message per group row (``TriggerCopiesWriter``: the writer before 0013, which
  supplies no copies);
- ``0019``: before migration 0020, the copies of 0011 only, read by the writer as since
  0013 (``SubsetlessCopiesWriter``);
- ``0023``: before migration 0024, the sort keys indexed alone, ``(key, id)``, with the
  service's writer (0024 changes indexes only);
- ``0026``: before migration 0027, the message id indexed alone, with the service's
  writer (0027 changes indexes only);
- ``0028``: before migration 0029, a group's rows without the message type's index and
  the queue address's without the address included (0029 changes indexes only);
- ``0028+type``: 0028 and migration 0029's index of a group's message type alone (the
  queue address's index as at 0028): what each half of 0029 costs;
- ``0029``: before migration 0031, the subsets' indexes without the fenced sorts' keys
  included (0030 touches no table the write path writes, 0031 changes indexes only);
- ``0031``: before migration 0032, an endpoint's and a queue address's message type not
  indexed after the subset (0032 adds indexes only);
- ``every``: head and an index for every other sort a group, an endpoint or a queue
  address offers (the group's, the endpoint's and the queue address's
  ``last_modified``): what indexing them all would cost, the form 0029 did not take;
- ``head``: the service's writer on the schema as migrated (since 0013 the writer reads
  the copies from the messages in its group-row insert; the trigger skips those rows;
  since 0020 the copies of the sort keys too, and the subsets' sort indexes; since 0024
  the status-led sort indexes in place of the sort keys' own; since 0027 the message
  id's too; since 0031 the fenced sorts' keys included in the subsets' indexes; since
  0032 an endpoint's and a queue address's message type indexed after the subset).

One round times the write path (``ingest.write_path``, ``--threads`` batches at once;
by default ``concurrent_batches``, as the service runs) once per variant, each on
emptied tables after a warm-up, with this process's CPU and the CPU of the PostgreSQL
backends serving it (``ingest.measure``); ``--rounds`` rounds, the variants' order
rotated each round. Prints each measurement, then per variant the median rate and CPU
per message, and per round the ratio of its CPU to the first variant's in the same round: CPU
per message is what to compare on a shared machine (rates move with the load).

Run: ``.venv/bin/python benchmarks/copies.py [--messages N] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from ingest import (
    ADMIN_URL_ENV,
    DEFAULT_ADMIN_URL,
    WARM_UP_MESSAGES,
    Instruments,
    Result,
    generate_messages,
    measure,
    scratch_database,
    timed_parse,
    write_path,
)

from controlroom.config import IngestionSettings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import failed_message_groups, failed_messages
from controlroom.errors.ingest.fold import FoldedMessage
from controlroom.errors.ingest.writer import FailedMessageBatchWriter

DEFAULT_MESSAGES = 10_000
DEFAULT_ROUNDS = 3


class TriggerCopiesWriter(FailedMessageBatchWriter):
    """The writer as it was before migration 0013: group rows inserted without copies
    (none on 0010; on 0011 the insert trigger looks each row's message up). A subclass
    names ``COPIES`` to read from the message in the insert, as the writer since 0013."""

    COPIES: tuple[str, ...] = ()

    def _replace_groups(
        self,
        conn: sa.Connection,
        folded: Sequence[FoldedMessage],
        stored: Sequence[sa.Row[Any]],
    ) -> None:
        stored_attempt = {row.id: row.last_failure_at for row in stored}
        winners = [
            message
            for message in folded
            if stored_attempt.get(message.unique_message_id) == message.last_failure_at
        ]
        if not winners:
            return
        conn.execute(
            sa.delete(failed_message_groups).where(
                self._provider.is_one_of(
                    failed_message_groups.c.failed_message_id,
                    [message.unique_message_id for message in winners],
                )
            )
        )
        rows = [
            {
                "failed_message_id": message.unique_message_id,
                "group_id": group.id,
                "classifier": group.classifier,
                "title": group.title,
            }
            for message in winners
            for group in message.winner.groups
        ]
        names = list(rows[0])
        given = self._provider.bound_rows(failed_message_groups, names)
        message = failed_messages.c
        copied = sa.select(*given.c, *(message[name] for name in self.COPIES)).join_from(
            given, failed_messages, message.id == given.c.failed_message_id
        )
        conn.execute(
            sa.insert(failed_message_groups).from_select([*names, *self.COPIES], copied),
            self._provider.bound_rows_parameters(names, rows),
        )


class SubsetlessCopiesWriter(TriggerCopiesWriter):
    """The writer before migration 0020: the copies of 0011 only (no sort keys)."""

    COPIES = ("status", "first_failure_at", "last_failure_at")


@dataclass(frozen=True)
class Variant:
    label: str
    revision: str
    writer: Callable[[sa.Engine], Any]
    extra: tuple[str, ...] = ()  # statements run after the migrations (PostgreSQL)


GROUP_MESSAGE_TYPE = (
    "CREATE INDEX ix_failed_message_groups_group_id_message_type "
    "ON failed_message_groups (group_id, message_type NULLS FIRST, failed_message_id)"
)
EVERY_SUBSET_SORT = (
    "CREATE INDEX ix_every_group_modified "
    "ON failed_message_groups (group_id, last_modified, failed_message_id)",
    "CREATE INDEX ix_every_endpoint_modified "
    "ON failed_messages (receiving_endpoint, last_modified, id)",
    "CREATE INDEX ix_every_queue_modified "
    "ON failed_messages (lower(queue_address), last_modified, id)",
)


VARIANTS = (
    Variant("0010", "0010", TriggerCopiesWriter),
    Variant("0011", "0011", TriggerCopiesWriter),
    Variant("0019", "0019", SubsetlessCopiesWriter),
    Variant("0023", "0023", FailedMessageBatchWriter),
    Variant("0026", "0026", FailedMessageBatchWriter),
    Variant("0028", "0028", FailedMessageBatchWriter),
    Variant("0028+type", "0028", FailedMessageBatchWriter, (GROUP_MESSAGE_TYPE,)),
    Variant("0029", "0029", FailedMessageBatchWriter),
    Variant("0031", "0031", FailedMessageBatchWriter),
    Variant("every", "head", FailedMessageBatchWriter, EVERY_SUBSET_SORT),
    Variant("head", "head", FailedMessageBatchWriter),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=DEFAULT_MESSAGES)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument(
        "--threads",
        type=int,
        default=IngestionSettings().concurrent_batches,
        help="batches written at once (default concurrent_batches, %(default)s, as the "
        "service); 1 keeps this run's own writers from contending with each other",
    )
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument(
        "--variants",
        default=",".join(v.label for v in VARIANTS),
        help="comma-separated labels of the variants to run (default all)",
    )
    args = parser.parse_args(argv)
    chosen = [v for v in VARIANTS if v.label in args.variants.split(",")]
    admin_url = os.environ.get(ADMIN_URL_ENV) or DEFAULT_ADMIN_URL
    concurrent = args.threads
    batch_size = IngestionSettings().batch_size
    messages = generate_messages(args.messages, seed=args.seed, now=datetime.now(UTC))
    attempts, _ = timed_parse(messages)
    del messages
    warm = attempts[:WARM_UP_MESSAGES]
    print(f"load average before: {', '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    results: dict[str, list[Result]] = {v.label: [] for v in chosen}
    with contextlib.ExitStack() as stack:
        engines: dict[str, tuple[sa.Engine, Instruments]] = {}
        for variant in chosen:
            url = stack.enter_context(scratch_database(admin_url))
            engine = create_store_engine(url, pool_size=max(2, concurrent))
            stack.callback(engine.dispose)
            upgrade_database(engine, variant.revision)
            if variant.extra:
                with engine.begin() as conn:
                    for statement in variant.extra:
                        conn.exec_driver_sql(statement)
            engine.dispose()  # every connection from here on is one ServerBackends sees
            engines[variant.label] = (engine, Instruments(engine))
        for round_ in range(args.rounds):
            order = chosen[round_ % len(chosen) :] + chosen[: round_ % len(chosen)]
            for variant in order:
                engine, instruments = engines[variant.label]
                result = measure(
                    variant.label,
                    engine,
                    lambda e=engine, w=variant.writer: write_path(
                        e, attempts, batch_size, concurrent, w
                    ),
                    warm_up=lambda e=engine, w=variant.writer: write_path(
                        e, warm, batch_size, concurrent, w
                    ),
                    messages=len(attempts),
                    instruments=instruments,
                )
                results[variant.label].append(result)
                load = os.getloadavg()[0]
                print(
                    f"round {round_ + 1} {variant.label:>5}: {result.per_second:7,.0f} msg/s, "
                    f"CPU ms/msg client {_ms(result.cpu_seconds, result)}, PG "
                    f"{_ms(result.server_cpu_seconds, result)}, both "
                    f"{_ms(result.cpu_seconds + result.server_cpu_seconds, result)}; rows "
                    f"{result.rows:,}, attempts {result.attempts:,}, groups {result.groups:,}; "
                    f"load {load:.2f}",
                    flush=True,
                )
    base_label = chosen[0].label
    base = results[base_label]
    print(f"median over rounds (CPU ms per message; ratio to {base_label}'s):")
    for label, runs in results.items():
        client = statistics.median(r.cpu_seconds / r.messages * 1000 for r in runs)
        server = statistics.median(r.server_cpu_seconds / r.messages * 1000 for r in runs)
        both = statistics.median(
            (r.cpu_seconds + r.server_cpu_seconds) / r.messages * 1000 for r in runs
        )
        rate = statistics.median(r.per_second for r in runs)
        line = (
            f"{label:>5}: {rate:7,.0f} msg/s, client {client:.3f}, PG {server:.3f}, both {both:.3f}"
        )
        if label != base_label:
            ratios = [
                (r.cpu_seconds + r.server_cpu_seconds) / (b.cpu_seconds + b.server_cpu_seconds)
                for r, b in zip(runs, base, strict=True)
            ]
            pg = [
                r.server_cpu_seconds / b.server_cpu_seconds for r, b in zip(runs, base, strict=True)
            ]
            line += (
                f"; both / {base_label} per round {', '.join(f'{x:.3f}' for x in ratios)}"
                f"; PG / {base_label} per round {', '.join(f'{x:.3f}' for x in pg)}"
            )
        print(line)
    print(f"load average after: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


def _ms(seconds: float, result: Result) -> str:
    return f"{1000 * seconds / result.messages:.3f}"


if __name__ == "__main__":
    sys.exit(main())
