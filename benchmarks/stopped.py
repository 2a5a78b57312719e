"""Subsets that stopped failing: the first page of a group, of an endpoint and of its queue
address that have had no failure since, and of a status no message entered since (the
archived), before and after failures elsewhere (docs/design.md "Reads at scale").

What it does (figures and conditions in ``benchmarks/README.md``):

1. Creates a scratch store (PostgreSQL next to the admin URL, or a SQLite file), applies
   the migrations and loads ``--base`` failed messages with ``query.py``'s loader (its
   templates, statuses and times over the 30 days before ``query.NOW``; counters filled).
2. Picks the quiet endpoint, the receiving endpoint of the most templates, and the quiet
   group, the group of that endpoint's templates that no other endpoint's template is in
   (the one in most of them).
3. Measures, through the HTTP app (``fastapi.testclient``), the first page of the group's
   messages, of the endpoint's, of the endpoint's Unresolved (``?status=unresolved``,
   since 2026-12-05), of the endpoint's queue address's (``/api/errors?
   queueaddress=``, since 2026-12-04 evening) and of the archived messages
   (``/api/errors?status=archived``), in the sort keys below, ``--repeat`` times after
   ``query.WARM_UP`` unmeasured calls: p50 and p95 in milliseconds. With ``--explain``,
   prints the plan of every statement of each page (``EXPLAIN (ANALYZE, BUFFERS)`` on
   PostgreSQL): the rows and buffers a page reads, which the machine's load does not move.
   Then more of the sorts a subset reads fenced (``FENCED``, since 2026-12-05): the
   group's unresolved messages by ``modified``, the endpoint's by status, and a deep page
   of the endpoint's by ``modified``.
4. For each total in ``--elsewhere`` (failures elsewhere so far): loads the difference,
   made from the templates of the other endpoints only, failing in the 30 days after all
   loaded before (``query.NOW`` moved on one window per step), every one Unresolved (as
   a new failure is, ``query.STATUS_WEIGHTS``: the archived stopped changing), refreshes
   the counters, and measures again. Prints every p95 and its ratio to the same page's before any
   failure elsewhere (target at most 1.2, and at most 50 ms at 1,250,000 rows).

Run: ``.venv/bin/python benchmarks/stopped.py [--database sqlite] [--base 250000]
[--elsewhere 250000,1000000]``. PostgreSQL server: ``CONTROLROOM_BENCH_POSTGRESQL_URL``
(an admin URL), default ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import query
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.providers.sqlite import PROVIDER as SQLITE_PROVIDER
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_group_counts,
    failed_message_tallies,
    failed_message_tally_deltas,
)
from controlroom.errors.ingest.bodies import FileSystemBodyStore

# (label, query parameters): ServicePulse's default first, then the other time keys and
# a key no subset index holds (read and sorted).
SORTS = (
    ("time_sent desc", {}),
    ("time_of_failure desc", {"sort": "time_of_failure"}),
    ("modified asc", {"sort": "modified", "direction": "asc"}),
    ("message_type asc", {"sort": "message_type", "direction": "asc"}),
)
FENCED = (
    # (label, subset, query parameters): more of the sorts a subset reads fenced and sorts
    # (docs/decisions.md "A subset is read from its own rows"): within a status, by a key
    # that is in the subset's index on no store (status), and a deep page (offset 4,950:
    # the sort keeps offset + limit rows).
    (
        "unresolved modified asc",
        "group",
        {"status": "unresolved", "sort": "modified", "direction": "asc"},
    ),
    ("status asc", "endpoint", {"sort": "status", "direction": "asc"}),
    ("modified asc page 100", "endpoint", {"sort": "modified", "direction": "asc", "page": "100"}),
)
TARGET_RATIO = 1.2
TARGET_P95_MS = 50.0


def quiet_subsets(templates: Sequence[query.Template]) -> tuple[str, str]:
    """(the quiet endpoint, the quiet group's id): the endpoint of the most templates, and
    of its groups the one in most of its templates that no other endpoint's template is in."""
    endpoints = Counter(t.attempt.receiving_endpoint for t in templates)
    endpoint = endpoints.most_common(1)[0][0]
    elsewhere = {
        group.id
        for t in templates
        if t.attempt.receiving_endpoint != endpoint
        for group in t.attempt.groups
    }
    own = Counter(
        group.id
        for t in templates
        if t.attempt.receiving_endpoint == endpoint
        for group in t.attempt.groups
        if group.id not in elsewhere
    )
    return endpoint, own.most_common(1)[0][0]


def queue_of(templates: Sequence[query.Template], endpoint: str) -> str:
    """The queue address of most of ``endpoint``'s templates."""
    queues = Counter(
        t.attempt.queue_address for t in templates if t.attempt.receiving_endpoint == endpoint
    )
    return queues.most_common(1)[0][0]


def load(url: str, messages: int, workers: int, engine: sa.Engine) -> None:
    """``messages`` more rows by ``query.py``'s loader (its templates and ``NOW`` as set
    now), then the counters refilled from every row (``query.count_loaded_rows``)."""
    engine.dispose()  # SQLite: the load changes the journal mode, alone on the file
    if query.is_sqlite(url):
        query.load_sqlite(query.sqlite_path(url), messages, workers)
    else:
        query.load(query.libpq_url(url), messages, workers)
    with engine.begin() as conn:
        for table in (failed_message_tallies, failed_message_tally_deltas):
            conn.execute(table.delete())
        conn.execute(failed_message_group_counts.delete())
    query.count_loaded_rows(engine)


def only_elsewhere(endpoint: str) -> Callable[[], list[query.Template]]:
    """``query.make_templates`` without the templates of ``endpoint`` (nor so of its
    own groups)."""
    make = query.make_templates

    def made() -> list[query.Template]:
        return [t for t in make() if t.attempt.receiving_endpoint != endpoint]

    return made


def scenarios(client: TestClient, endpoint: str, group: str, queue: str) -> list[query.Scenario]:
    def get(path: str, params: dict[str, str]) -> Callable[[], str]:
        def run() -> str:
            response = client.get(path, params=params)
            response.raise_for_status()
            return f"{len(response.json())} rows of {response.headers.get('Total-Count')}"

        return run

    subsets = {
        "group": (f"/api/recoverability/groups/{group}/errors", {}),
        "endpoint": (f"/api/endpoints/{endpoint}/errors", {}),
        "endpoint unresolved": (f"/api/endpoints/{endpoint}/errors", {"status": "unresolved"}),
        "queue address": ("/api/errors", {"queueaddress": queue}),
        "archived": ("/api/errors", {"status": "archived"}),
    }
    return [
        query.Scenario(f"{kind} {sort}", get(path, {**subset, **params}))
        for kind, (path, subset) in subsets.items()
        for sort, params in SORTS
    ] + [
        query.Scenario(f"{kind} {sort}", get(subsets[kind][0], {**subsets[kind][1], **params}))
        for sort, kind, params in FENCED
    ]


def measure(
    url: str, engine: sa.Engine, subsets: tuple[str, str, str], args: argparse.Namespace
) -> list[query.Result]:
    """Every page of ``scenarios``, measured (and explained with ``--explain``)."""
    log = query.StatementLog(engine)
    with tempfile.TemporaryDirectory() as scratch:
        settings = Settings(data_dir=Path(scratch), database_url=url)
        app = create_app(settings, engine, FileSystemBodyStore(Path(scratch) / "bodies"))
        with TestClient(app) as client:
            results = []
            for scenario in scenarios(client, *subsets):
                results.append(query.measure(scenario, args.repeat))
                found = results[-1]
                print(
                    f"{found.p50_ms:9.1f} {found.p95_ms:9.1f}  {found.name} ({found.detail})",
                    flush=True,
                )
                if args.explain:
                    with log.capture() as statements:
                        scenario.run()
                    print(query.explain(url, statements), flush=True)
    return results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--database", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--sqlite-dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--base", type=int, default=250_000, help="messages before they stop")
    parser.add_argument(
        "--elsewhere",
        default="250000,1000000",
        help="comma-separated totals of failures elsewhere to measure at (after 0)",
    )
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--explain", action="store_true", help="print each page's statements' plans"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    totals = [int(total) for total in args.elsewhere.split(",")]
    if args.database == SQLITE_PROVIDER.name:
        store = query.scratch_sqlite(args.sqlite_dir, None, keep=False)
    else:
        admin_url = os.environ.get(query.ADMIN_URL_ENV, query.DEFAULT_ADMIN_URL)
        store = query.scratch_database(admin_url, None, keep=False)
    print(f"load average before: {query.load_average()}", flush=True)
    with store as (url, _):
        engine = create_store_engine(url)
        upgrade_database(engine)
        templates = query.make_templates()
        endpoint, group = quiet_subsets(templates)
        subsets = (endpoint, group, queue_of(templates, endpoint))
        load(url, args.base, args.workers, engine)
        print("\n".join(query.environment(url)))
        print(
            f"quiet endpoint {endpoint}, quiet group {group}, quiet queue {subsets[2]}; "
            "p50 p95 (ms)",
            flush=True,
        )
        print(f"--- 0 failures elsewhere ({args.base:,} rows)", flush=True)
        steps: list[tuple[int, list[query.Result]]] = [(0, measure(url, engine, subsets, args))]
        query.make_templates = only_elsewhere(endpoint)  # type: ignore[assignment]
        query.STATUS_WEIGHTS = ((FailedMessageStatus.UNRESOLVED, 1),)  # new failures
        base_now, done = query.NOW, 0
        for step, total in enumerate(totals, start=1):
            query.NOW = base_now + query.WINDOW * step  # after every failure loaded before
            query.SEED = 1_000_000 * step  # rows of their own, not the first load's again
            load(url, total - done, args.workers, engine)
            done = total
            print(f"--- {total:,} failures elsewhere ({args.base + total:,} rows)", flush=True)
            steps.append((total, measure(url, engine, subsets, args)))
        engine.dispose()
    print(f"load average after: {query.load_average()}")
    report(steps)
    return 0


def report(steps: Sequence[tuple[int, Sequence[query.Result]]]) -> None:
    """Per page: its p95 at each step and the ratio to the step without failures
    elsewhere."""
    print(
        "\np95 ms (ratio to 0 elsewhere) per failures elsewhere: "
        + ", ".join(f"{total:,}" for total, _ in steps)
    )
    first: Sequence[Any] = steps[0][1]
    for index, before in enumerate(first):
        cells = [
            f"{results[index].p95_ms:7.1f} ({results[index].p95_ms / before.p95_ms:4.2f}x)"
            for _, results in steps
        ]
        print(f"{before.name:>28}: " + "  ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
