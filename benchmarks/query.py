"""Query benchmark: the error instance's read API on PostgreSQL with a million failed
messages.

What it does (see ``benchmarks/README.md`` for the figures and how to read them):

1. Creates a scratch database next to the admin URL and applies the migrations.
2. Loads ``--messages`` (default 1,000,000) realistic failed messages, fast: a pool of
   templates from ``controlroom.demo`` (NServiceBus 5-10 and Python header sets, JSON and
   XML bodies, .NET and Python stack traces), each in ``VARIANTS`` renamed copies so that
   there are some hundreds of message types and failure groups, parsed once with
   ``parse_failed_message``; every row then gets its own UniqueMessageId, message id,
   times within the last 30 days, status (70 % unresolved, 10 % resolved, 5 % retry
   issued, 15 % archived) and attempt count, written into its headers too; each loading
   process makes its rows oldest failure first, so the table follows time as the
   service's does (``failure_ages``). Rows and their
   group rows go in with ``COPY`` from ``--workers`` processes; the secondary indexes,
   the full-text GIN index and the foreign key are dropped for the load and rebuilt after,
   then ``VACUUM ANALYZE``. What the write path would write, from the project's own code:
   each row's ``search_vector`` holds the terms of ``errors.ingest.search_terms`` (the
   terms of the header values no row changes, and of the body, computed once per
   template; those of the few values holding a per-row value, per row; ``check_terms``
   proves the union equal to the whole message's terms for every template), and each
   group row the copies of its message's status and failure window that migration
   0011's triggers would give it (the load runs with triggers off,
   ``session_replication_role = replica``); the tallies and group counts are filled from
   the loaded rows as their migrations fill them (``count_loaded_rows``).
3. Measures, through the HTTP app (``fastapi.testclient``, the whole request path, no
   socket), or with ``--http`` through real HTTP (``controlroom serve`` on a socket, one
   keep-alive ``httpx`` connection carrying every scenario's requests, large answers and
   small ones in turn), the latency of each scenario ``--repeat`` times after ``WARM_UP``
   unmeasured calls, and prints p50 / p95 in milliseconds: the first page of
   ``/api/errors``, a deep page, status filtered pages, other sort keys, full-text
   searches (one hit, a selective term, a broad term, several words), the summary and
   counts, queue addresses, the groups view of every classifier, and a group's messages
   and the group by id for the smallest, a middle-sized and the biggest group.
4. With ``--while-ingesting``, measures every scenario again while another process
   writes new failed messages through the service's writer at full speed (two batches
   of 200 at once, each message parsed as the pipeline parses it), prints both figures
   and their ratio, then deletes what it wrote.
5. With ``--while-spinning``, measures every scenario again beside one busy loop per
   core, a neighbour that takes the CPU and touches nothing else: the control that tells
   how much of the slowdown while ingesting is the CPU share on this machine.
6. With ``--explain``, prints ``EXPLAIN (ANALYZE, BUFFERS)`` of every statement a scenario
   runs (``--only`` picks scenarios by name).

Run: ``.venv/bin/python benchmarks/query.py`` (see the README for the time it takes).
``--keep`` leaves the database for more runs with ``--reuse NAME`` (which also applies
newer migrations to it first). ``--messages 100000`` for a quicker look. Server:
``CONTROLROOM_BENCH_POSTGRESQL_URL`` (an admin URL), default
``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import random
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import sqlalchemy as sa
from fastapi.testclient import TestClient
from pgserver import add_server_arguments, admin_server, describe_server
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect

from controlroom.app import create_app
from controlroom.config import IngestionSettings, Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.providers.sqlite import PROVIDER as SQLITE_PROVIDER
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_group_counts,
    failed_message_groups,
    failed_message_tallies,
    failed_messages,
)
from controlroom.demo import format_nsb_time, generate_demo_messages
from controlroom.errors import tallies
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.grouping import CLASSIFIERS
from controlroom.errors.ingest.headers import MESSAGE_ID
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.search_backfill import stored_search_terms
from controlroom.errors.ingest.search_terms import message_search_terms
from controlroom.errors.ingest.upsert import failure_time_value
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt
from controlroom.errors.read.search import search_failed_messages
from controlroom.exceptions import MessageRejected

try:  # written alongside this benchmark; measured through its function when no route serves it
    from controlroom.errors.read import groups
except ImportError:
    groups = None  # type: ignore[assignment]

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
ADMIN_URL_ENV = "CONTROLROOM_BENCH_POSTGRESQL_URL"
DEFAULT_MESSAGES = 1_000_000
NOW = datetime(2026, 11, 1, tzinfo=UTC)
WINDOW = timedelta(days=30)  # failures spread over the 30 days before NOW
BASE_MESSAGES = 600  # demo messages the templates are made from
VARIANTS = 40  # renamed copies of each message type (and of its handler frames)
TEMPLATES = 4_000
WARM_UP = 3
HTTP_TIMEOUT = 60.0  # seconds per request over the socket (--http)
SERVE_START_SECONDS = 60.0  # for serve to answer on its socket (--http)
SEED = 1_000  # of the loaders' generators: another load of the same store needs another
SERVE_KEEPS_LOADED = ("ERROR_RETENTION_PERIOD=P3650D",)
"""Settings of every ``controlroom serve`` started over a loaded store (``NAME=VALUE``,
``serve.serve_environment``). The loaded rows fail in the 30 days before ``NOW``, a fixed
date: once the clock is past ``NOW`` plus the retention period (15 days by default), the
retention sweep serve runs at start-up would delete every Resolved and Archived row
(a quarter of the store) while the views are measured."""
MAX_BODY_SIZE_TO_STORE = 102_400

STATUS_WEIGHTS = (
    (FailedMessageStatus.UNRESOLVED, 70),
    (FailedMessageStatus.RESOLVED, 10),
    (FailedMessageStatus.RETRY_ISSUED, 5),
    (FailedMessageStatus.ARCHIVED, 15),
)
ATTEMPT_WEIGHTS = ((1, 80), (2, 15), (3, 5))

# COPY column lists in the tables' own order; message_row builds its tuple in that order.
MESSAGE_COLUMNS = tuple(failed_messages.c.keys())
GROUP_COLUMNS = tuple(failed_message_groups.c.keys())
LOADED_TABLES = ("failed_messages", "failed_message_groups")


# --- templates ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Template:
    """A parsed failure whose per-message values get replaced in every row made from it.

    Its search terms are split for speed: ``fixed_terms`` of every header value that no
    row changes and of the body, computed once; ``varying`` the header values that hold a
    per-row value (message id, times), whose terms each row computes. The tokenizer cuts
    every header value on its own (values are joined by a separator), so the union is
    the terms of the whole message (``check_terms`` compares the two for every template).
    """

    attempt: FailedAttempt
    time_of_failure_text: str  # as written in its headers
    time_sent_text: str | None
    fixed_terms: frozenset[str]
    fixed_text: str  # fixed_terms in tsvector input form
    fixed_words: str  # fixed_terms as SQLite's column holds them (space separated)
    varying: tuple[str, ...]  # header values holding a per-row value


def split_terms(
    attempt: FailedAttempt, headers: dict[str, str | None], replaced: Sequence[str]
) -> tuple[frozenset[str], tuple[str, ...]]:
    """The terms of the headers that hold none of ``replaced`` (and of the body), and the
    header values that hold one."""
    varying = tuple(
        value for value in headers.values() if value and any(r in value for r in replaced)
    )
    fixed = {name: value for name, value in headers.items() if value not in varying}
    return frozenset(message_search_terms(fixed, attempt.body_placement.text)), varying


def renamed(headers: dict[str, str | None], variant: int) -> dict[str, str | None]:
    """``headers`` with the message type's short name numbered (``PlaceOrder`` ->
    ``PlaceOrder07``) in every value: the type, its handler's frames, the exception data."""
    message_type = h.message_type(headers) or ""
    short = message_type.rpartition(".")[2]
    if not short:
        return dict(headers)
    new = f"{short}{variant:02}"
    return {
        key: None if value is None else value.replace(short, new) for key, value in headers.items()
    }


def make_templates(count: int = TEMPLATES, seed: int = 7) -> list[Template]:
    """``count`` parsed templates: demo messages in ``VARIANTS`` renamed copies."""
    rng = random.Random(seed)
    base = generate_demo_messages(BASE_MESSAGES, seed=seed, now=NOW)
    templates: list[Template] = []
    while len(templates) < count:
        message = rng.choice(base)
        headers = renamed(message.headers, rng.randrange(VARIANTS))
        try:
            attempt = parse_failed_message(
                headers, message.body, max_body_size_to_store=MAX_BODY_SIZE_TO_STORE
            )
        except MessageRejected:
            continue  # the demo's one deliberately broken message
        if attempt.body_placement.external:
            continue  # keep the load free of body-store writes
        failed_text = headers[h.TIME_OF_FAILURE] or ""
        sent_text = headers.get(h.TIME_SENT)
        replaced = [attempt.message_id, failed_text, *([sent_text] if sent_text else [])]
        fixed, varying = split_terms(attempt, headers, replaced)
        words = sorted(fixed)
        template = Template(
            attempt, failed_text, sent_text, fixed, tsvector_text(words), " ".join(words), varying
        )
        check_terms(template, rng)
        templates.append(template)
    return templates


def check_terms(template: Template, rng: random.Random) -> None:
    """Fail unless a row made from ``template`` gets exactly the terms the write path
    would compute for it (``errors.ingest.search_backfill.stored_search_terms`` over the
    row's own headers and body)."""
    row, _, fresh = make_row(template, rng)
    headers_json = row[MESSAGE_COLUMNS.index("headers_json")]
    body_text = row[MESSAGE_COLUMNS.index("body_text")]
    expected = set(stored_search_terms(headers_json, body_text))
    made = template.fixed_terms | set(fresh)
    if made != expected:
        raise AssertionError(f"terms differ: {sorted(made ^ expected)[:10]}")


# --- rows ---------------------------------------------------------------------------------
def _weighted(rng: random.Random, weights: Sequence[tuple[Any, int]]) -> Any:
    return rng.choices([value for value, _ in weights], [weight for _, weight in weights])[0]


def tsvector_text(terms: Sequence[str]) -> str:
    """``terms`` in ``tsvector`` input form (each quoted, ``'`` doubled, ``\\`` escaped),
    the text ``COPY`` gives the ``search_vector`` column; the service binds the terms
    instead (``array_to_tsvector``)."""
    return " ".join("'" + t.replace("\\", "\\\\").replace("'", "''") + "'" for t in terms)


def _naive(instant: datetime) -> datetime:
    return instant.astimezone(UTC).replace(tzinfo=None)


def failure_ages(
    rng: random.Random, count: int, oldest: float = 1.0, newest: float = 0.0
) -> list[float]:
    """``count`` random ages (fractions of ``WINDOW`` before ``NOW``) between ``newest``
    and ``oldest``, the oldest first: rows are loaded in the order they fail, as the
    service stores them, so that the table's order follows time as it does in service
    (loaded in random order, an index-only walk in time order switched visibility-map
    pages at almost every entry: 418,000 buffer reads for the deep page)."""
    return sorted((rng.uniform(newest, oldest) for _ in range(count)), reverse=True)


def make_rows(
    templates: Sequence[Template], rng: random.Random, age: float
) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """One failed-message row (``MESSAGE_COLUMNS``) failing ``age`` x ``WINDOW`` before
    ``NOW``, and its group rows."""
    row, groups, _ = make_row(rng.choice(templates), rng, age)
    return row, groups


def make_row(
    template: Template, rng: random.Random, age: float | None = None
) -> tuple[tuple[Any, ...], list[tuple[Any, ...]], list[str]]:
    """A row from ``template`` failing ``age`` x ``WINDOW`` before ``NOW`` (random when
    ``None``), its group rows, and the terms it adds to the template's."""
    attempt = template.attempt
    unique_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    message_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    failed_at = NOW - WINDOW * (rng.random() if age is None else age)
    sent_at = failed_at - timedelta(seconds=rng.uniform(0.05, 30))
    attempts = _weighted(rng, ATTEMPT_WEIGHTS)
    first_failed_at = failed_at - timedelta(minutes=rng.uniform(1, 600) * (attempts - 1))
    status = _weighted(rng, STATUS_WEIGHTS)
    modified = failed_at
    if status is not FailedMessageStatus.UNRESOLVED:
        modified = min(NOW, failed_at + timedelta(hours=rng.uniform(0.1, 48)))
    replacements = [
        (attempt.message_id, message_id),
        (template.time_of_failure_text, format_nsb_time(failed_at)),
    ]
    if template.time_sent_text:
        replacements.append((template.time_sent_text, format_nsb_time(sent_at)))
    headers_json = attempt.headers_json
    varying = list(template.varying)
    for old, new in replacements:
        headers_json = headers_json.replace(old, new)
        varying = [value.replace(old, new) for value in varying]
    terms = message_search_terms(dict(enumerate(map(str, varying))), None)
    fresh = [term for term in terms if term not in template.fixed_terms]
    row = (
        unique_id,
        message_id,
        int(status),
        _naive(modified),
        _naive(modified),
        attempts,
        _naive(first_failed_at),
        _naive(failed_at),
        # Only the last time is known: the earlier attempts follow the seed's rule.
        [failure_time_value(failed_at)],
        attempt.message_type,
        _naive(sent_at) if template.time_sent_text else None,
        attempt.is_system_message,
        attempt.conversation_id,
        attempt.exception_type,
        attempt.exception_message,
        attempt.exception_source,
        attempt.stack_trace,
        attempt.queue_address,
        attempt.receiving_endpoint,
        attempt.receiving_host_id,
        attempt.receiving_host,
        attempt.sending_endpoint,
        attempt.sending_host_id,
        attempt.sending_host,
        headers_json,
        attempt.content_type,
        attempt.body_placement.size,
        attempt.body_placement.text,
        False,
        None,
        f"{template.fixed_text} {tsvector_text(fresh)}",
    )
    # The group rows with the copies of the message's columns that the database's
    # triggers would give them (migrations 0011, 0020; the load runs without triggers),
    # in the order of GROUP_COLUMNS.
    copies = (
        int(status),
        _naive(first_failed_at),
        _naive(failed_at),
        _naive(sent_at) if template.time_sent_text else None,
        _naive(modified),
        attempt.message_type,
        message_id,
    )
    groups = [
        (unique_id, group.id, group.classifier, group.title, *copies) for group in attempt.groups
    ]
    return row, groups, fresh


_TEMPLATES: list[Template] = []  # built in the parent, inherited by forked loaders


def load_part(args: tuple[str, int, int]) -> int:
    """Load ``count`` rows (seeded by ``part``) into the database at ``url`` with COPY."""
    url, part, count = args
    rng = random.Random(SEED + part)
    with psycopg.connect(url) as conn, conn.cursor() as cursor:
        conn.execute("SET synchronous_commit = off")
        # No triggers: the rows already hold what they would write (superuser only).
        conn.execute("SET session_replication_role = replica")
        groups: list[tuple[Any, ...]] = []
        columns = ", ".join(MESSAGE_COLUMNS)
        with cursor.copy(f"COPY failed_messages ({columns}) FROM STDIN") as copy:
            for age in failure_ages(rng, count):
                row, row_groups = make_rows(_TEMPLATES, rng, age)
                copy.write_row(row)
                groups.extend(row_groups)
        with cursor.copy(
            f"COPY failed_message_groups ({', '.join(GROUP_COLUMNS)}) FROM STDIN"
        ) as copy:
            for group_row in groups:
                copy.write_row(group_row)
    return count


@dataclass
class SchemaObjects:
    """Indexes and foreign keys dropped for the load, with the SQL that recreates them."""

    drop: list[str]
    create: list[str]


def secondary_objects(conn: psycopg.Connection[Any]) -> SchemaObjects:
    """Every non-primary-key index and foreign key of the loaded tables."""
    indexes = conn.execute(
        "SELECT i.indexname, i.indexdef FROM pg_indexes i "
        "JOIN pg_class c ON c.relname = i.indexname JOIN pg_index x ON x.indexrelid = c.oid "
        "WHERE i.tablename = ANY(%s) AND NOT x.indisprimary",
        (list(LOADED_TABLES),),
    ).fetchall()
    keys = conn.execute(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE contype = 'f' AND conrelid::regclass::text = ANY(%s)",
        (list(LOADED_TABLES),),
    ).fetchall()
    drop = [f'ALTER TABLE {table} DROP CONSTRAINT "{name}"' for table, name, _ in keys]
    drop += [f'DROP INDEX "{name}"' for name, _ in indexes]
    create = [definition for _, definition in indexes]
    create += [f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {spec}' for table, name, spec in keys]
    return SchemaObjects(drop, create)


def build(url: str, statements: Sequence[str]) -> None:
    """Run ``statements`` (index and constraint definitions) on one connection."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute("SET max_parallel_maintenance_workers = 2")
        for statement in statements:
            conn.execute(statement)


def load(url: str, messages: int, workers: int) -> dict[str, float]:
    """Fill the empty store at ``url``; seconds per phase."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    _TEMPLATES[:] = make_templates()
    timings["templates"] = time.perf_counter() - started
    with psycopg.connect(url, autocommit=True) as conn:
        objects = secondary_objects(conn)
        for statement in objects.drop:
            conn.execute(statement)
    started = time.perf_counter()
    parts = [
        (url, part, messages // workers + (part < messages % workers)) for part in range(workers)
    ]
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        loaded = sum(pool.map(load_part, parts))
        pool.close()
        pool.join()  # so that the workers' CPU time is counted below
    assert loaded == messages
    timings["copy"] = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    timings["(of which rows made, CPU of the loading processes)"] = (
        after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    )
    started = time.perf_counter()
    # Statistics first: without them the foreign key's validation was planned as a
    # nested loop over 5,000,000 group rows (7 minutes instead of 5 seconds).
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ANALYZE {', '.join(LOADED_TABLES)}")
    # The GIN index is most of the rebuild and builds on one core: it gets a connection
    # of its own while the b-tree indexes and foreign keys are built on another.
    full_text = [s for s in objects.create if " USING gin " in s]
    rest = [s for s in objects.create if s not in full_text]
    with ThreadPoolExecutor(2) as builders:
        for done in [builders.submit(build, url, part) for part in (full_text, rest)]:
            done.result()
    timings["indexes"] = time.perf_counter() - started
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        for table in LOADED_TABLES:
            conn.execute(f"VACUUM ANALYZE {table}")
    timings["vacuum analyze"] = time.perf_counter() - started
    return timings


def count_loaded_rows(engine: sa.Engine) -> None:
    """Fill the counters the loaded rows would have made, had the triggers been on: the
    tallies (migration 0012) and the group counts (migration 0014), each as its migration
    fills it from the rows already there. Without them the counts, the summary and the
    groups views read 0, and a group's page takes the form of a small group."""
    messages = [failed_messages.c[name] for name in tallies.KEY]
    groups = failed_message_groups.c
    group_key = [groups.classifier, groups.group_id, groups.status]
    with engine.begin() as conn:
        conn.execute(
            failed_message_tallies.insert().from_select(
                [*tallies.KEY, "messages"],
                sa.select(*messages, sa.func.count()).group_by(*messages),
            )
        )
        conn.execute(
            failed_message_group_counts.insert().from_select(
                [*(c.name for c in group_key), "n"],
                sa.select(*group_key, sa.func.count())
                .where(groups.status.is_not(None))
                .group_by(*group_key),
            )
        )


# --- SQLite -------------------------------------------------------------------------------
SQLITE_CHUNK = 10_000  # rows a loading process makes per task
SQLITE_TRANSACTION = 100_000  # rows per load transaction
# During the load only (the service's connections set WAL and synchronous NORMAL again):
# no rollback journal, no fsync, foreign keys unchecked (every group row's message is in
# the same chunk), a 2 GB page cache for the index builds.
SQLITE_LOAD_PRAGMAS = (
    "PRAGMA journal_mode = OFF",
    "PRAGMA synchronous = OFF",
    "PRAGMA foreign_keys = OFF",
    "PRAGMA cache_size = -2000000",
)


def _sqlite_binders(table: sa.Table) -> list[Callable[[Any], Any] | None]:
    """Per column of ``table``, what SQLAlchemy's SQLite dialect does to a value on its
    way to the driver, past the column type's own ``process_bind_param`` (the rows are
    already in its output form: naive UTC datetimes, the terms' text): ``DATETIME`` to
    its text form, ``JSON`` to its text, ``Boolean`` to 0/1."""
    dialect = sqlite_dialect()
    binders = []
    for column in table.c:
        impl = column.type.dialect_impl(dialect)
        if isinstance(impl, sa.types.TypeDecorator):
            impl = impl.impl_instance.dialect_impl(dialect)
        binders.append(impl.bind_processor(dialect))
    return binders


def _bound(row: Sequence[Any], binders: Sequence[Callable[[Any], Any] | None]) -> tuple[Any, ...]:
    return tuple(v if b is None else b(v) for v, b in zip(row, binders, strict=True))


def sqlite_rows(
    args: tuple[int, int, float, float],
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """``count`` message rows (seeded by ``seed``), failing between ages ``oldest`` and
    ``newest`` (``failure_ages``), and their group rows as the service's
    SQLite writes store them: ``make_row``'s rows with the terms' text in
    ``search_vector`` (the same terms as PostgreSQL's ``tsvector``) and every value bound
    as SQLAlchemy binds it."""
    seed, count, oldest, newest = args
    rng = random.Random(seed)
    message_binders = _sqlite_binders(failed_messages)
    group_binders = _sqlite_binders(failed_message_groups)
    terms_at = MESSAGE_COLUMNS.index("search_vector")
    rows, groups = [], []
    for age in failure_ages(rng, count, oldest, newest):
        template = rng.choice(_TEMPLATES)
        row, row_groups, fresh = make_row(template, rng, age)
        words = " ".join([template.fixed_words, *fresh]) if fresh else template.fixed_words
        rows.append(_bound((*row[:terms_at], words, *row[terms_at + 1 :]), message_binders))
        groups.extend(_bound(group, group_binders) for group in row_groups)
    return rows, groups


def sqlite_secondary_objects(conn: sqlite3.Connection) -> SchemaObjects:
    """Every explicit index and every trigger of the loaded tables (the FTS5 table's
    triggers among them), dropped for the load; the FTS5 index is rebuilt after."""
    names = ", ".join("?" for _ in LOADED_TABLES)
    found = conn.execute(
        f"SELECT type, name, sql FROM sqlite_master WHERE type IN ('index', 'trigger') "
        f"AND sql IS NOT NULL AND tbl_name IN ({names}) ORDER BY type, name",
        LOADED_TABLES,
    ).fetchall()
    drop = [f'DROP {kind.upper()} "{name}"' for kind, name, _ in found]
    create = [sql for kind, _, sql in found if kind == "index"]
    create.append("INSERT INTO failed_messages_fts(failed_messages_fts) VALUES ('rebuild')")
    create += [sql for kind, _, sql in found if kind == "trigger"]
    return SchemaObjects(drop, create)


def load_sqlite(path: Path, messages: int, workers: int) -> dict[str, float]:
    """Fill the empty, migrated SQLite store at ``path``; seconds per phase.

    ``workers`` processes make the rows, this one inserts them (``executemany``, one
    transaction per ``SQLITE_TRANSACTION`` rows) with the secondary indexes and the
    triggers dropped: the group rows already hold the copies migration 0011's triggers
    would give them, and the FTS5 index is rebuilt from ``search_vector`` after the
    load (what its insert trigger would have indexed, row by row)."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    _TEMPLATES[:] = make_templates()
    timings["templates"] = time.perf_counter() - started
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in SQLITE_LOAD_PRAGMAS:
        conn.execute(pragma)
    objects = sqlite_secondary_objects(conn)
    for statement in objects.drop:
        conn.execute(statement)
    insert_messages = (
        f"INSERT INTO failed_messages ({', '.join(MESSAGE_COLUMNS)}) "
        f"VALUES ({', '.join('?' for _ in MESSAGE_COLUMNS)})"
    )
    insert_groups = (
        f"INSERT INTO failed_message_groups ({', '.join(GROUP_COLUMNS)}) "
        f"VALUES ({', '.join('?' for _ in GROUP_COLUMNS)})"
    )
    started = time.perf_counter()
    # Chunk by chunk from the oldest failures to the newest (``failure_ages``).
    chunks = [
        (
            SEED + index,
            min(SQLITE_CHUNK, messages - start),
            1 - start / messages,
            1 - min(start + SQLITE_CHUNK, messages) / messages,
        )
        for index, start in enumerate(range(0, messages, SQLITE_CHUNK))
    ]
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    loaded = 0
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        conn.execute("BEGIN")
        for rows, groups in pool.imap(sqlite_rows, chunks):
            conn.executemany(insert_messages, rows)
            conn.executemany(insert_groups, groups)
            loaded += len(rows)
            if loaded % SQLITE_TRANSACTION == 0:
                conn.execute("COMMIT")
                conn.execute("BEGIN")
        conn.execute("COMMIT")
        pool.close()
        pool.join()  # so that the workers' CPU time is counted below
    assert loaded == messages
    timings["insert"] = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    timings["(of which rows made, CPU of the loading processes)"] = (
        after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    )
    started = time.perf_counter()
    for statement in objects.create:
        conn.execute(statement)
    timings["indexes, FTS5 rebuild, triggers"] = time.perf_counter() - started
    conn.execute("PRAGMA journal_mode = WAL")  # the service's mode (it sets it on connect)
    conn.close()
    return timings


@contextmanager
def scratch_sqlite(parent: Path, reuse: str | None, keep: bool) -> Iterator[tuple[str, bool]]:
    """(SQLAlchemy URL of the benchmark's SQLite file, whether it is new): a new file in a
    scratch directory under ``parent``, deleted afterwards unless ``keep``; or ``reuse``,
    an existing file, left in place."""
    if reuse:
        yield SQLITE_PROVIDER.file_url(Path(reuse)), False
        return
    parent.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="controlroom_bench_query_", dir=parent))
    path = directory / "controlroom.db"
    try:
        yield SQLITE_PROVIDER.file_url(path), True
    finally:
        if keep:
            print(f"kept database {path} (--database sqlite --reuse {path})")
        else:
            shutil.rmtree(directory)


def sqlite_path(url: str) -> Path:
    return Path(sa.make_url(url).database or "")


def sqlite_environment(url: str) -> list[str]:
    path = sqlite_path(url)
    size = sum(f.stat().st_size for f in path.parent.glob(path.name + "*"))
    with closing(sqlite3.connect(path)) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        cache_size = conn.execute("PRAGMA cache_size").fetchone()[0]
        rows = conn.execute("SELECT count(*) FROM failed_messages").fetchone()[0]
        groups = conn.execute("SELECT count(*) FROM failed_message_groups").fetchone()[0]
    return [
        f"SQLite {sqlite3.sqlite_version} (page_size {page_size}, default cache_size "
        f"{cache_size}), file {size / 2**30:.1f} GiB",
        f"{rows:,} failed messages, {groups:,} group rows",
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}, {load_average()}",
    ]


def sqlite_explain(url: str, statements: Sequence[tuple[str, Any]]) -> str:
    """``EXPLAIN QUERY PLAN`` of every query among ``statements`` (SQLite has no
    ``ANALYZE`` option: the plan, not the time)."""
    lines = []
    with closing(sqlite3.connect(sqlite_path(url))) as conn:
        for statement, parameters in statements:
            if not statement.lstrip().upper().startswith(("SELECT", "WITH")):
                continue
            plan = conn.execute(f"EXPLAIN QUERY PLAN {statement}", parameters).fetchall()
            lines.append(statement.strip().splitlines()[0][:120])
            lines += ["    " + "  " * depth(row, plan) + row[3] for row in plan]
    return "\n".join(lines)


def depth(row: Sequence[Any], plan: Sequence[Sequence[Any]]) -> int:
    """How deep ``row`` of an ``EXPLAIN QUERY PLAN`` answer sits (its parent chain)."""
    parents = {node[0]: node[1] for node in plan}
    level, parent = 0, row[1]
    while parent in parents:
        level, parent = level + 1, parents[parent]
    return level


# --- ingesting meanwhile ------------------------------------------------------------------
def ingest_until(url: str, stop: Any, seed: int) -> tuple[int, float, list[str]]:
    """Write new failed messages through the service's writer, ``concurrent_batches``
    batches of ``batch_size`` at once (``IngestionSettings``' defaults, as ``serve``
    writes them), parsing each message as the pipeline does, until ``stop`` is set.
    Returns (messages written, seconds, their UniqueMessageIds)."""
    settings = IngestionSettings()
    engine = create_store_engine(url)
    writer = FailedMessageBatchWriter(engine)
    base = [
        m
        for m in generate_demo_messages(BASE_MESSAGES, seed=seed, now=NOW)
        if MESSAGE_ID in m.headers
    ]
    rng = random.Random(seed)
    lock = threading.Lock()
    written: list[str] = []

    def batch() -> None:
        attempts = []
        while len(attempts) < settings.batch_size:
            message = rng.choice(base)
            headers = dict(message.headers)
            headers[MESSAGE_ID] = str(uuid.uuid4())
            headers[h.TIME_OF_FAILURE] = format_nsb_time(datetime.now(UTC))
            try:
                attempt = parse_failed_message(
                    headers, message.body, max_body_size_to_store=MAX_BODY_SIZE_TO_STORE
                )
            except MessageRejected:
                continue
            if not attempt.body_placement.external:
                attempts.append(attempt)
        writer.write(IngestionBatch(attempts=attempts))
        with lock:
            written.extend(a.unique_message_id for a in attempts)

    def loop() -> None:
        while not stop.is_set():
            batch()

    started = time.perf_counter()
    threads = [threading.Thread(target=loop) for _ in range(settings.concurrent_batches)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    engine.dispose()
    return len(written), seconds, written


def remove_ingested(url: str, ids: Sequence[str]) -> None:
    """Delete what ``ingest_until`` wrote (its group rows and index entries by cascade
    and triggers), so a kept database stays as loaded."""
    if is_sqlite(url):
        with closing(sqlite3.connect(sqlite_path(url), timeout=60)) as conn, conn:
            conn.execute("PRAGMA foreign_keys = ON")
            conn.executemany("DELETE FROM failed_messages WHERE id = ?", [(i,) for i in ids])
        return
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute("DELETE FROM failed_messages WHERE id = ANY(%s)", (list(ids),))


# --- measuring ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    run: Callable[[], Any]
    http: bool = True
    """False for the scenarios that call the service's functions in this process (no
    request travels): ``views_http.py`` measures only those that are requests."""


@dataclass(frozen=True, slots=True)
class Result:
    name: str
    p50_ms: float
    p95_ms: float
    detail: str


def measure(scenario: Scenario, repeat: int) -> Result:
    detail = ""
    for _ in range(WARM_UP):
        detail = scenario.run()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        scenario.run()
        samples.append((time.perf_counter() - started) * 1000)
    cut = statistics.quantiles(samples, n=20, method="inclusive")
    return Result(scenario.name, statistics.median(samples), cut[18], str(detail))


class StatementLog:
    """The SQL statements (with parameters) an engine runs while ``capture`` is active."""

    def __init__(self, engine: sa.Engine) -> None:
        self.statements: list[tuple[str, Any]] = []
        self.active = False
        sa.event.listen(engine, "before_cursor_execute", self._record)

    def _record(self, _conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if self.active:
            self.statements.append((statement, parameters))

    @contextmanager
    def capture(self) -> Iterator[list[tuple[str, Any]]]:
        self.statements = []
        self.active = True
        try:
            yield self.statements
        finally:
            self.active = False


def explain(url: str, statements: Sequence[tuple[str, Any]]) -> str:
    if is_sqlite(url):
        return sqlite_explain(url, statements)
    lines = []
    with psycopg.connect(libpq_url(url)) as conn:
        for statement, parameters in statements:
            if not statement.lstrip().upper().startswith(("SELECT", "WITH")):
                conn.execute(statement, parameters or None)  # SET LOCAL: in effect for the rest
                lines.append(statement)
                continue
            plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {statement}", parameters).fetchall()
            lines.append(statement.strip().splitlines()[0][:120])
            lines += ["    " + row[0] for row in plan]
    return "\n".join(lines)


def scenarios(client: httpx.Client, engine: sa.Engine, messages: int) -> list[Scenario]:
    """The measured requests through ``client`` (the in-process test client, or one
    keep-alive connection to a served socket, ``served_client``), on the database of
    ``engine``; each returns a short description of its answer."""

    def get(path: str, **params: Any) -> Callable[[], str]:
        def run() -> str:
            response = client.get(path, params=params)
            if response.status_code != 200:
                raise RuntimeError(f"{path} {params}: {response.status_code} {response.text[:200]}")
            total = response.headers.get("Total-Count")
            if total and response.headers.get("Total-Count-Estimated") == "true":
                total = "~" + total  # an estimate (README, Compatibility)
            size = len(response.json())
            return f"{size} items" + (f" of {total}" if total else "")

        return run

    with engine.connect() as conn:
        known_message_id = conn.execute(
            sa.text("SELECT message_id FROM failed_messages ORDER BY id LIMIT 1 OFFSET :n"),
            {"n": messages // 3},
        ).scalar_one()
    deep_page = max(1, messages // 50 // 2)
    found: list[Scenario] = [
        Scenario("errors: first page (default sort time_sent desc)", get("/api/errors")),
        Scenario(
            f"errors: deep page {deep_page:,} (offset {(deep_page - 1) * 50:,})",
            get("/api/errors", page=deep_page),
        ),
        Scenario("errors: status=unresolved, first page", get("/api/errors", status="unresolved")),
        Scenario("errors: status=archived, first page", get("/api/errors", status="archived")),
        Scenario("errors: status=-archived, first page", get("/api/errors", status="-archived")),
        Scenario(
            "errors: status=unresolved, sort=time_of_failure",
            get("/api/errors", status="unresolved", sort="time_of_failure"),
        ),
        Scenario(
            "errors: sort=modified asc, first page",
            get("/api/errors", sort="modified", direction="asc"),
        ),
        Scenario(
            "errors: sort=message_type asc, first page",
            get("/api/errors", sort="message_type", direction="asc"),
        ),
        Scenario("errors: sort=status, first page", get("/api/errors", sort="status")),
        Scenario(
            "errors: modified range (one day), first page",
            get(
                "/api/errors",
                modified=f"{NOW - timedelta(days=3):%Y-%m-%dT%H:%M:%SZ}..."
                f"{NOW - timedelta(days=2):%Y-%m-%dT%H:%M:%SZ}",
            ),
        ),
        Scenario("errors: endpoint Sales, first page", get("/api/endpoints/Sales/errors")),
        Scenario(
            "errors: HEAD (count only)", lambda: client.head("/api/errors").headers["Total-Count"]
        ),
        Scenario("errors/counts", get("/api/errors/counts")),
        Scenario("errors/queues/addresses", get("/api/errors/queues/addresses")),
        Scenario("search: a message id (1 hit)", get(f"/api/messages/search/{known_message_id}")),
        Scenario(
            "search: 'ChargeCreditCard07' (selective)",
            get("/api/messages/search/ChargeCreditCard07"),
        ),
        Scenario(
            "search: 'System.InvalidOperationException' (broad)",
            get("/api/messages/search/System.InvalidOperationException"),
        ),
        Scenario(
            "search: 'HttpRequestException 503' (two words)",
            get("/api/messages/search", q="HttpRequestException 503"),
        ),
        Scenario(
            "search: 'System.InvalidOperationException PlaceOrder00' (broad and selective)",
            get("/api/messages/search", q="System.InvalidOperationException PlaceOrder00"),
        ),
        Scenario(
            "search: 'Shipping NullReferenceException ShipOrder15' (three words)",
            get("/api/messages/search", q="Shipping NullReferenceException ShipOrder15"),
        ),
        Scenario(
            "search: 'InvalidOperation*' (prefix of a broad word)",
            get("/api/messages/search/InvalidOperation*"),
        ),
        Scenario(
            "search: 'ChargeCreditCard0*' (prefix, selective)",
            get("/api/messages/search/ChargeCreditCard0*"),
        ),
        Scenario(
            "search: 'inv*' (prefix of 3 letters)",
            get("/api/messages/search/inv*"),
        ),
        Scenario(
            "search: 'ChargeCreditCard' (no whole word: the console widens it)",
            widened_search(engine, "ChargeCreditCard"),
            http=False,
        ),
        Scenario("errors/summary", get("/api/errors/summary")),
    ]
    for size, (group_id, count) in group_sizes(engine).items():
        found += [
            Scenario(
                f"group's messages: {size} group ({count:,} rows)",
                get(f"/api/recoverability/groups/{group_id}/errors"),
            ),
            Scenario(
                f"group's messages: {size} group, status=unresolved, sort=time_of_failure",
                get(
                    f"/api/recoverability/groups/{group_id}/errors",
                    status="unresolved",
                    sort="time_of_failure",
                ),
            ),
            Scenario(
                f"group by id: {size} group", get(f"/api/recoverability/groups/id/{group_id}")
            ),
        ]
    routes = client.get("/openapi.json").json()["paths"]
    if "/api/recoverability/groups/{classifier}" in routes:
        for classifier in CLASSIFIERS:
            found.append(
                Scenario(
                    f"groups: {classifier.name}",
                    get(f"/api/recoverability/groups/{quote(classifier.name)}"),
                )
            )
        found.append(
            Scenario(
                "groups: default classifier, sort=growth",
                get("/api/recoverability/groups", sort="growth"),
            )
        )
    else:
        found += group_function_scenarios(engine)
    return found


def widened_search(engine: sa.Engine, text: str) -> Callable[[], str]:
    """The console's search of ``text`` (first page, exact count up to the default limit):
    a search that finds no whole word runs again with its words as prefixes."""

    def run() -> str:
        with engine.connect() as conn:
            found = search_failed_messages(
                conn, text, offset=0, limit=50, exact_count_limit=10_000, widen=True
            )
        widened = f", widened {list(found.widened)}" if found.widened else ""
        return f"{len(found.items)} items of {found.total}{widened}"

    return run


def group_sizes(engine: sa.Engine) -> dict[str, tuple[str, int]]:
    """The smallest, a middle-sized and the biggest group: (group id, group rows)."""
    with engine.connect() as conn:
        sizes = conn.execute(
            sa.text(
                "SELECT group_id, count(*) FROM failed_message_groups "
                "GROUP BY group_id ORDER BY 2, 1"
            )
        ).all()
    return {"small": sizes[0], "medium": sizes[len(sizes) // 2], "biggest": sizes[-1]}


def group_function_scenarios(engine: sa.Engine) -> list[Scenario]:
    """The groups view through ``errors.groups.list_groups`` when no route serves it."""
    if groups is None:
        print("no controlroom.errors.read.groups: the groups view is not measured", file=sys.stderr)
        return []

    def run(name: str) -> Callable[[], str]:
        def call() -> str:
            with engine.connect() as conn:
                return f"{len(groups.list_groups(conn, name))} groups"

        return call

    return [Scenario(f"groups (function): {c.name}", run(c.name), http=False) for c in CLASSIFIERS]


# --- running ------------------------------------------------------------------------------
@contextmanager
def scratch_database(admin_url: str, reuse: str | None, keep: bool) -> Iterator[tuple[str, bool]]:
    """(SQLAlchemy URL of the benchmark database, whether it is new)."""
    admin = sa.make_url(admin_url)
    name = reuse or f"controlroom_bench_query_{uuid.uuid4().hex[:8]}"
    url = admin.set(database=name).render_as_string(hide_password=False)
    if not reuse:
        engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        engine.dispose()
    try:
        yield url, not reuse
    finally:
        if not keep and not reuse:
            engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
            with engine.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            engine.dispose()
        elif not reuse:
            print(f"kept database {name} (--reuse {name})")


def libpq_url(url: str) -> str:
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def is_sqlite(url: str) -> bool:
    return sa.make_url(url).get_backend_name() == SQLITE_PROVIDER.name


def environment(url: str) -> list[str]:
    """What the figures depend on: the server and its settings (autovacuum first,
    ``pgserver.describe_server``), the database's size and rows, Python, the CPUs."""
    if is_sqlite(url):
        return sqlite_environment(url)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as sa_conn:
        server = describe_server(sa_conn)
    engine.dispose()
    with psycopg.connect(libpq_url(url)) as conn:
        size = conn.execute(
            "SELECT pg_size_pretty(pg_database_size(current_database()))"
        ).fetchone()[0]  # type: ignore[index]
        rows = conn.execute("SELECT count(*) FROM failed_messages").fetchone()[0]  # type: ignore[index]
        groups = conn.execute("SELECT count(*) FROM failed_message_groups").fetchone()[0]  # type: ignore[index]
    return [
        f"PostgreSQL {server}, database {size}",
        f"{rows:,} failed messages, {groups:,} group rows",
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}, {load_average()}",
    ]


def load_average() -> str:
    """The machine's 1/5/15-minute load: client and server share its CPUs."""
    return "load average " + " ".join(f"{value:.2f}" for value in os.getloadavg())


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, all) CPU time of the whole machine since boot, from ``/proc/stat``."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


@contextmanager
def busy_cores(label: str) -> Iterator[None]:
    """Print how many of the machine's cores were busy (any process) during the block:
    whether a neighbour took the CPU. Linux only; elsewhere prints nothing."""
    try:
        before = _cpu_jiffies()
    except OSError:
        yield
        return
    yield
    busy, every = (after - first for after, first in zip(_cpu_jiffies(), before, strict=True))
    cores = os.cpu_count() or 1
    print(f"{label}: {cores * busy / max(every, 1):.2f} of {cores} cores busy", flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=DEFAULT_MESSAGES)
    parser.add_argument("--repeat", type=int, default=30, help="measured calls per scenario")
    parser.add_argument("--workers", type=int, default=2, help="loading processes")
    parser.add_argument(
        "--database",
        choices=("postgresql", SQLITE_PROVIDER.name),
        default="postgresql",
        help="the store to load and measure (sqlite: a file in a scratch directory)",
    )
    parser.add_argument(
        "--sqlite-dir",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="where the SQLite scratch directory is made (a million rows take ~GB)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument(
        "--reuse",
        metavar="NAME",
        help="measure an already loaded database (with --database sqlite: its file)",
    )
    parser.add_argument("--explain", action="store_true", help="print the plans too")
    parser.add_argument("--only", help="measure only scenarios whose name contains this")
    parser.add_argument(
        "--while-ingesting",
        action="store_true",
        help="measure again while another process ingests at full speed",
    )
    parser.add_argument(
        "--while-spinning",
        action="store_true",
        help="measure again beside one busy loop per core (the CPU-only control)",
    )
    parser.add_argument(
        "--http",
        action="store_true",
        help="measure through real HTTP: controlroom serve on a socket, one keep-alive "
        "httpx client (default: the in-process test client)",
    )
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    if args.scratch_server and (args.keep or args.reuse or args.database != "postgresql"):
        parser.error("--scratch-server is deleted after the run: no --keep, --reuse or sqlite")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.database == SQLITE_PROVIDER.name:
        store = scratch_sqlite(args.sqlite_dir, args.reuse, args.keep)
        with store as (url, new):
            return run(args, url, new)
    admin_url = os.environ.get(ADMIN_URL_ENV, DEFAULT_ADMIN_URL)
    with (
        admin_server(args, admin_url) as admin,
        scratch_database(admin, args.reuse, args.keep) as (url, new),
    ):
        return run(args, url, new)


def prepare_store(url: str, new: bool, messages: int, workers: int) -> None:
    """Migrate the store at ``url`` to head (a reused one gets the newest indexes too) and,
    when ``new``, load ``messages`` rows with ``workers`` processes and fill the counters;
    prints the load's phases."""
    engine = create_store_engine(url)
    upgrade_database(engine)
    engine.dispose()  # SQLite: the load changes the journal mode, alone on the file
    if new:
        started = time.perf_counter()
        if is_sqlite(url):
            timings = load_sqlite(sqlite_path(url), messages, workers)
        else:
            timings = load(libpq_url(url), messages, workers)
        counting = time.perf_counter()
        count_loaded_rows(engine)
        timings["counters"] = time.perf_counter() - counting
        timings["total"] = time.perf_counter() - started
        print(
            "load: " + ", ".join(f"{phase} {seconds:.0f} s" for phase, seconds in timings.items())
        )
    engine.dispose()


def run(args: argparse.Namespace, url: str, new: bool) -> int:
    """Load ``url`` when ``new``, then measure every chosen scenario on it."""
    prepare_store(url, new, args.messages, args.workers)
    engine = create_store_engine(url)
    print("\n".join(environment(url)))
    log = StatementLog(engine)
    with tempfile.TemporaryDirectory() as scratch:
        if args.http:
            client_context: AbstractContextManager[httpx.Client] = served_client(url, scratch)
        else:
            settings = Settings(data_dir=Path(scratch), database_url=url)
            app = create_app(settings, engine, FileSystemBodyStore(Path(scratch) / "bodies"))
            client_context = TestClient(app)
        with client_context as client:
            print(f"measured through {client_description(client)}")
            chosen = [
                scenario
                for scenario in scenarios(client, engine, args.messages)
                if not args.only or args.only in scenario.name
            ]
            with busy_cores("idle"):
                results = run_scenarios(chosen, args, log, url)
            busy: dict[str, list[Result]] = {}
            if args.while_ingesting:
                busy["ingesting"] = run_while_ingesting(chosen, args, log, url)
            if args.while_spinning:
                busy["spinning"] = run_while_spinning(chosen, args, log, url)
    engine.dispose()
    print(f"\nafter measuring: {load_average()}")
    report(results, busy)
    return 0


@contextmanager
def served_client(url: str, data_dir: str) -> Iterator[httpx.Client]:
    """``controlroom serve`` on a real socket (uvicorn, 127.0.0.1, a free port) over the
    database of ``url``, ingesting nothing (``ingest_on_serve`` off: the reader alone, or
    beside ``--while-ingesting``'s own writer) and sweeping nothing (``SERVE_KEEPS_LOADED``),
    and one ``httpx.Client`` to it: one keep-alive connection that every scenario's
    requests share, large answers and small ones in turn. Serve is stopped (SIGTERM) on the
    way out."""
    from serve import DEFAULT_RABBITMQ_URL, _stop, free_port, serve_environment

    port = free_port()
    environment = serve_environment(
        url, DEFAULT_RABBITMQ_URL, data_dir, port, ["INGEST_ON_SERVE=false", *SERVE_KEEPS_LOADED]
    )
    command = [str(Path(sys.executable).with_name("controlroom")), "serve"]
    log_path = Path(data_dir) / "serve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, env=environment, stdout=log, stderr=subprocess.STDOUT, cwd=data_dir
        )
    try:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", timeout=HTTP_TIMEOUT, limits=limits
        ) as client:
            deadline = time.monotonic() + SERVE_START_SECONDS
            while True:
                try:
                    client.get("/metrics").raise_for_status()
                    break
                except httpx.TransportError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            "serve did not start: " + log_path.read_text(errors="replace")[-2000:]
                        ) from None
                    time.sleep(0.2)
            yield client
    finally:
        _stop(process)


def client_description(client: httpx.Client) -> str:
    """How the requests travel: in process, or over which socket."""
    if isinstance(client, TestClient):
        return "the in-process test client (no socket, serial)"
    return f"real HTTP: controlroom serve (uvicorn) at {client.base_url}, one keep-alive connection"


def run_scenarios(
    chosen: Sequence[Scenario], args: argparse.Namespace, log: StatementLog, url: str
) -> list[Result]:
    results = []
    for scenario in chosen:
        results.append(measure(scenario, args.repeat))
        result = results[-1]
        figures = f"{result.p50_ms:9.1f} {result.p95_ms:9.1f}"
        print(f"{figures}  {result.name} ({result.detail})", flush=True)
        if args.explain:
            with log.capture() as statements:
                scenario.run()
            print(explain(url, statements), flush=True)
    return results


def run_while_ingesting(
    chosen: Sequence[Scenario], args: argparse.Namespace, log: StatementLog, url: str
) -> list[Result]:
    """The scenarios again while another process ingests at full speed; what it wrote is
    deleted afterwards."""
    context = multiprocessing.get_context("spawn")
    stop = context.Manager().Event()
    with context.Pool(1) as pool:
        ingesting = pool.apply_async(ingest_until, (url, stop, 23))
        time.sleep(5)  # let it reach full speed
        print(f"\nwhile ingesting ({load_average()}):", flush=True)
        with busy_cores("while ingesting"):
            busy = run_scenarios(chosen, args, log, url)
        stop.set()
        count, seconds, ids = ingesting.get()
    print(f"ingested meanwhile: {count:,} messages in {seconds:.0f} s ({count / seconds:.0f}/s)")
    remove_ingested(url, ids)
    return busy


def spin(stop: Any) -> None:
    """Take a core until ``stop`` is set, and nothing else: no database, no I/O."""
    while not stop.is_set():
        for _ in range(200_000):  # a few ms between asking the manager
            pass


def run_while_spinning(
    chosen: Sequence[Scenario], args: argparse.Namespace, log: StatementLog, url: str
) -> list[Result]:
    """The scenarios again beside one busy loop per core: the CPU-only control for
    ``--while-ingesting``. On a machine whose cores the ingesting process and its
    database backends keep busy, a reader gets its share of the CPU and no more; what
    ingesting costs beyond this control is what the read side loses to the writes
    themselves (locks, I/O, plans, caches)."""
    context = multiprocessing.get_context("spawn")
    stop = context.Manager().Event()
    cores = os.cpu_count() or 1
    with context.Pool(cores) as pool:
        spinners = [pool.apply_async(spin, (stop,)) for _ in range(cores)]
        time.sleep(1)
        print(f"\nbeside {cores} busy loops ({load_average()}):", flush=True)
        with busy_cores("beside the busy loops"):
            spun = run_scenarios(chosen, args, log, url)
        stop.set()
        for spinner in spinners:
            spinner.get()
    return spun


def report(results: Sequence[Result], busy: dict[str, list[Result]]) -> None:
    """A Markdown table: p50 / p95 idle, then per busy run its p50 / p95 and the ratio of
    its p95 to the idle p95; with both busy runs, the ratio of the ingesting p95 to the
    spinning p95 (what ingesting costs past the CPU share)."""
    runs = list(busy.values())
    both = {"ingesting", "spinning"} <= busy.keys()
    heads = "".join(f" {run} p50 | {run} p95 | p95 ratio |" for run in busy)
    heads += " ingesting / spinning p95 |" if both else ""
    print(f"\n| scenario | p50 ms | p95 ms |{heads} answer |")
    columns = 3 * len(runs) + both
    print("| --- | ---: | ---: |" + " ---: |" * columns + " --- |")
    for index, idle in enumerate(results):
        cells = "".join(
            f" {run[index].p50_ms:.1f} | {run[index].p95_ms:.1f} | "
            f"{run[index].p95_ms / idle.p95_ms:.2f} |"
            for run in runs
        )
        if both:
            against = busy["ingesting"][index].p95_ms / busy["spinning"][index].p95_ms
            cells += f" {against:.2f} |"
        print(f"| {idle.name} | {idle.p50_ms:.1f} | {idle.p95_ms:.1f} |{cells} {idle.detail} |")


if __name__ == "__main__":
    sys.exit(main())
