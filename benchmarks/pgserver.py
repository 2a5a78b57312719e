"""The PostgreSQL a benchmark measures, and what it says about that server.

Two things every PostgreSQL benchmark (``ingest.py``, ``serve.py``, ``query.py``) shares:

- ``server_settings`` / ``describe_server``: the settings that move its figures, printed
  with every figure. ``autovacuum`` first: this machine's server runs with it off
  (Debian's cluster plus a CI override) while production runs with it on, and a drain
  that leaves every dead row in the counter tables measures a store nobody runs.
- ``scratch_server``: a PostgreSQL of the benchmark's own, as production runs it. The
  same binaries as the machine's server (``/usr/lib/postgresql/<newest>/bin``), ``initdb``
  into a scratch directory (as the ``postgres`` user when this process is root:
  ``initdb`` refuses root), started by ``pg_ctl`` on a free port of 127.0.0.1 with
  trust authentication, the settings of ``SCRATCH_SETTINGS`` (autovacuum on, everything
  else at ``initdb``'s defaults, which are the machine's server's but for autovacuum)
  plus any given, and stopped and deleted on the way out, also when a run fails. With
  ``--production-settings``, also ``PRODUCTION_SETTINGS``: the memory and WAL settings the
  README's "What the store needs" asks of production, sized for this machine.
- ``table_state``: live and dead rows (``pg_stat_user_tables``) and sizes of the tables
  a drain rewrites, and how often autovacuum got to them.
- ``process_cpu_seconds`` / ``backend_cpu``: a process's CPU time from ``/proc`` (the
  server must run on this machine), and a clock of one session's backend; with
  ``tsvector_text`` (a message's search terms as a ``tsvector``'s text) and
  ``add_url_argument`` (``--url``, a libpq URL), what the scripts that time one
  session's statements share (``gin_pending.py``, ``toast_compression.py``).

Each script takes ``--scratch-server`` (and ``--scratch-setting NAME=VALUE``, repeatable)
through ``add_server_arguments`` and opens its admin URL with ``admin_server``.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

from controlroom.errors.ingest.search_terms import message_search_terms

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
ADMIN_URL_ENV = "CONTROLROOM_BENCH_POSTGRESQL_URL"

SCRATCH_SETTINGS: Mapping[str, str] = {
    "autovacuum": "on",
    "listen_addresses": "'127.0.0.1'",
    "fsync": "on",
    "synchronous_commit": "on",
}
"""What a scratch server runs with besides ``initdb``'s defaults (``port`` and the socket
directory are its own): production's autovacuum, durable commits as on the machine's."""

PRODUCTION_SETTINGS = (
    "shared_buffers=4GB",
    "effective_cache_size=12GB",
    "max_wal_size=8GB",
    "min_wal_size=1GB",
    "checkpoint_timeout=15min",
    "checkpoint_completion_target=0.9",
)
"""The memory and WAL settings of README "What the store needs" on this machine (2 cores,
23 GB of RAM): shared buffers that hold the indexes every write touches at random (the
primary keys of the messages and their group rows, the message and conversation ids, the
full-text index: 450 MB at 150,000 messages, about 3 GB at 1,000,000; all the indexes of
the two tables are 1.3 GB at 150,000), the planner told of the OS cache,
and checkpoints far enough apart that a page written many times between two of them is
logged whole (a full-page image) once, not after every few seconds' worth of WAL
(``controlroom serve`` warns of smaller ones: ``Provider.server_settings_warnings``).
``huge_pages`` stays at its default, ``try``: PostgreSQL takes huge pages only where the
machine has reserved them (``vm.nr_hugepages``), which is the machine's setting, not
the server's; ``serve.py --variant huge_pages=on`` measures them beside 4 kB pages."""

REPORTED_SETTINGS = (
    "autovacuum",
    "autovacuum_naptime",
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_vacuum_cost_limit",
    "autovacuum_vacuum_cost_delay",
    "shared_buffers",
    "effective_cache_size",
    "work_mem",
    "synchronous_commit",
    "fsync",
    "max_wal_size",
    "checkpoint_timeout",
    "wal_compression",
)
"""The settings printed with every figure (``SHOW``)."""

DRAIN_TABLES = (
    "failed_messages",
    "failed_message_groups",
    "failed_message_group_counts",
    "failed_message_tally_deltas",
    "failed_message_tallies",
    "known_endpoints",
)
"""The tables a drain of the error queue writes: the messages, their group rows, and the
counters the database keeps beside them (migrations 0012 and 0014)."""

SERVER_OWNER = "postgres"
INITDB_OPTIONS = ("-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8")
INITDB_OPTIONS += ("--no-sync",)  # a scratch cluster: its files need not survive a crash


def server_settings(conn: sa.Connection) -> dict[str, str]:
    """``{name: value}`` of ``REPORTED_SETTINGS`` and ``server_version``, as ``SHOW``
    gives them."""
    names = ("server_version", *REPORTED_SETTINGS)
    return {name: str(conn.exec_driver_sql(f"SHOW {name}").scalar_one()) for name in names}


def describe_server(conn: sa.Connection) -> str:
    """One line: ``PostgreSQL 15.20 (autovacuum=on, ...)`` with ``REPORTED_SETTINGS``."""
    settings = server_settings(conn)
    version = settings.pop("server_version")
    return f"{version} (" + ", ".join(f"{k}={v}" for k, v in settings.items()) + ")"


@dataclass(frozen=True)
class TableState:
    """One table as ``pg_stat_user_tables`` and ``pg_total_relation_size`` saw it."""

    name: str
    live: int
    dead: int
    bytes: int
    """Heap, indexes and TOAST."""
    autovacuums: int
    autoanalyzes: int
    reloptions: str


def table_state(conn: sa.Connection, tables: Sequence[str] = DRAIN_TABLES) -> list[TableState]:
    """Rows and sizes of ``tables`` in ``conn``'s database (statistics as last flushed by
    the server's backends: read them after the writers have disconnected)."""
    rows = conn.execute(
        sa.text(
            "SELECT s.relname, s.n_live_tup, s.n_dead_tup, pg_total_relation_size(s.relid), "
            "s.autovacuum_count, s.autoanalyze_count, "
            "coalesce(array_to_string(c.reloptions, ', '), '') "
            "FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
            "WHERE s.relname = ANY(:tables)"
        ),
        {"tables": list(tables)},
    ).all()
    found = {row[0]: TableState(*row) for row in rows}
    return [found[name] for name in tables if name in found]


def format_table_state(states: Sequence[TableState]) -> list[str]:
    """Markdown rows: table | live | dead | size MB | autovacuums | reloptions."""
    lines = [
        "| table | live rows | dead rows | size MB | autovacuums / analyzes | reloptions |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    lines += [
        f"| {s.name} | {s.live:,} | {s.dead:,} | {s.bytes / 2**20:,.1f} | "
        f"{s.autovacuums} / {s.autoanalyzes} | {s.reloptions} |"
        for s in states
    ]
    return lines


def drained_tables(conn: sa.Connection) -> list[str]:
    """``format_table_state`` of ``table_state``: the drained tables as Markdown rows."""
    return format_table_state(table_state(conn))


# --- processes' CPU from /proc, search terms as text ------------------------------------
def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or
    ``None`` when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            stat = file.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def live_processes() -> dict[int, list[str]]:
    """Every live process's ``stat_fields``, by pid."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := stat_fields(int(entry))) is not None:
            found[int(entry)] = fields
    return found


def cpu_seconds(fields: list[str], *, reaped_children: bool = False) -> float:
    """utime + stime (and the reaped children's cutime + cstime) of ``stat_fields``."""
    ticks = fields[11:15] if reaped_children else fields[11:13]
    return sum(int(value) for value in ticks) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` from ``/proc``; 0 if it is gone."""
    fields = stat_fields(pid)
    return 0.0 if fields is None else cpu_seconds(fields)


def backend_cpu(conn: psycopg.Connection[Any]) -> Callable[[], float]:
    """A clock of the CPU seconds of ``conn``'s backend process (``pg_backend_pid()``):
    what the server spent on this session's statements, whatever the client waited."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    pid = int(row[0])
    return lambda: process_cpu_seconds(pid)


def lexeme(term: str) -> str:
    """``term`` as a quoted lexeme of a ``tsvector``'s text form."""
    return "'" + term.replace("\\", "\\\\").replace("'", "''") + "'"


def tsvector_text(headers: Mapping[str, str | None], body: bytes) -> str:
    """A message's search terms (``message_search_terms`` of its headers and UTF-8 body)
    as a ``tsvector``'s text form: each term one quoted lexeme, as the write path stores
    them (no parser, no stemming)."""
    return " ".join(lexeme(term) for term in message_search_terms(headers, body.decode()))


def add_url_argument(parser: argparse.ArgumentParser) -> None:
    """``--url``: the server to measure, a libpq URL (default ``ADMIN_URL_ENV`` or
    ``DEFAULT_ADMIN_URL``, SQLAlchemy's ``+psycopg`` taken out)."""
    url = os.environ.get(ADMIN_URL_ENV) or DEFAULT_ADMIN_URL
    parser.add_argument("--url", default=url.replace("+psycopg", ""))


# --- a server of the benchmark's own -------------------------------------------------------
def postgresql_bin() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding ``initdb`` (Debian's
    layout), else the directory of ``initdb`` on ``PATH``."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: int(Path(path).parent.parent.name.split(".")[0]),
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError("no initdb: install PostgreSQL's server binaries")
    return Path(initdb).parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _as_owner(command: Sequence[str]) -> list[str]:
    """``command`` as ``SERVER_OWNER`` when this process is root, else as it is."""
    if os.geteuid() == 0:
        return ["runuser", "-u", SERVER_OWNER, "--", *command]
    return list(command)


@contextlib.contextmanager
def scratch_server(settings: Sequence[str] = ()) -> Iterator[str]:
    """A new PostgreSQL cluster in a scratch directory, running for the block; yields its
    admin URL (``postgresql+psycopg://postgres@127.0.0.1:<port>/postgres``, trust).

    ``settings`` are ``NAME=VALUE`` lines over ``SCRATCH_SETTINGS`` (e.g.
    ``autovacuum=off`` for the same binaries as the machine's server runs them).
    Raises ``subprocess.CalledProcessError`` when ``initdb`` or ``pg_ctl`` fails; the
    directory is removed either way."""
    bindir = postgresql_bin()
    scratch = Path(tempfile.mkdtemp(prefix="controlroom-bench-pg-"))
    data, log = scratch / "data", scratch / "server.log"
    port = _free_port()
    if os.geteuid() == 0:
        shutil.chown(scratch, user=SERVER_OWNER)
    started = False
    try:
        subprocess.run(
            _as_owner([str(bindir / "initdb"), "-D", str(data), *INITDB_OPTIONS]),
            check=True,
            capture_output=True,
        )
        lines = {**SCRATCH_SETTINGS, "port": str(port), "unix_socket_directories": f"'{scratch}'"}
        for setting in settings:
            name, _, value = setting.partition("=")
            lines[name.strip()] = value.strip()
        conf = "".join(f"{name} = {value}\n" for name, value in lines.items())
        subprocess.run(
            _as_owner(["sh", "-c", f"cat >> {data / 'postgresql.conf'}"]),
            input=conf.encode(),
            check=True,
        )
        subprocess.run(
            _as_owner([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "start"]),
            check=True,
            capture_output=True,
        )
        started = True
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            subprocess.run(
                _as_owner([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                check=False,
                capture_output=True,
            )
        shutil.rmtree(scratch, ignore_errors=True)


def restart_server(admin_url: str) -> None:
    """Restart the server of ``admin_url`` with ``pg_ctl restart`` (fast shutdown, waiting
    until it answers again), for a setting only a start applies (``huge_pages``,
    ``shared_buffers``). Only for a server on this machine whose data directory this
    process may run ``pg_ctl`` on: a ``scratch_server``. Its log goes beside the data
    directory, as ``scratch_server`` started it. Raises ``subprocess.CalledProcessError``
    when the server does not come back (its log says why)."""
    admin = sa.create_engine(admin_url, poolclass=sa.NullPool)
    with admin.connect() as conn:
        data = Path(conn.exec_driver_sql("SHOW data_directory").scalar_one())
    admin.dispose()
    command = [
        str(postgresql_bin() / "pg_ctl"),
        "-D",
        str(data),
        "-l",
        str(data.parent / "server.log"),
    ]
    subprocess.run(
        _as_owner([*command, "-m", "fast", "-w", "restart"]), check=True, capture_output=True
    )


# --- the scripts' options ------------------------------------------------------------------
def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """``--scratch-server`` and ``--scratch-setting``."""
    parser.add_argument(
        "--scratch-server",
        action="store_true",
        help="run against a PostgreSQL of the benchmark's own (initdb + pg_ctl in a scratch "
        "directory, autovacuum on, as production runs), not the admin URL's server",
    )
    parser.add_argument(
        "--scratch-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a postgresql.conf line for the scratch server (e.g. autovacuum=off); repeatable",
    )
    parser.add_argument(
        "--production-settings",
        action="store_true",
        help="with --scratch-server: the memory and WAL settings production is asked for "
        "(PRODUCTION_SETTINGS: shared_buffers, effective_cache_size, max_wal_size, "
        "checkpoint_timeout), before any --scratch-setting",
    )


@contextlib.contextmanager
def admin_server(args: argparse.Namespace, admin_url: str) -> Iterator[str]:
    """The admin URL to measure against: a scratch server's with ``--scratch-server``
    (stopped and deleted after the block), else ``admin_url``."""
    if not args.scratch_server:
        if getattr(args, "production_settings", False):
            raise SystemExit("--production-settings needs --scratch-server")
        yield admin_url
        return
    settings = list(args.scratch_setting)
    if getattr(args, "production_settings", False):
        settings = [*PRODUCTION_SETTINGS, *settings]
    with scratch_server(settings) as url:
        yield url


# --- what the server ran: pg_stat_statements ------------------------------------------------
STATEMENTS_SETTINGS = (
    "shared_preload_libraries='pg_stat_statements'",
    "pg_stat_statements.track=all",
    "pg_stat_statements.max=10000",
)
"""``scratch_server`` settings that count every statement, those run inside trigger
functions too (``track=all``: a nested statement's time is also in its caller's)."""


def enable_statements(conn: sa.Connection) -> None:
    """``CREATE EXTENSION pg_stat_statements`` in ``conn``'s database (the view is read
    from there; it counts every database's statements). Needs ``STATEMENTS_SETTINGS``."""
    conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
    conn.commit()


@dataclass(frozen=True)
class StatementStats:
    """One ``pg_stat_statements`` entry (or the difference of two readings of it)."""

    query: str
    toplevel: bool
    calls: int
    rows: int
    exec_ms: float
    """Execution time (wall clock, waits included), ms."""
    plan_ms: float
    blocks_hit: int
    blocks_dirtied: int
    wal_bytes: int

    def __sub__(self, other: StatementStats) -> StatementStats:
        return StatementStats(
            self.query,
            self.toplevel,
            self.calls - other.calls,
            self.rows - other.rows,
            self.exec_ms - other.exec_ms,
            self.plan_ms - other.plan_ms,
            self.blocks_hit - other.blocks_hit,
            self.blocks_dirtied - other.blocks_dirtied,
            self.wal_bytes - other.wal_bytes,
        )


StatementsReading = dict[tuple[int, bool], StatementStats]
"""``{(queryid, toplevel): stats}`` of one database at one moment."""


def read_statements(conn: sa.Connection, database: str | None = None) -> StatementsReading:
    """Every entry of ``pg_stat_statements`` for ``database`` (all when None), but the
    view's own readings and resets."""
    rows = conn.execute(
        sa.text(
            "SELECT s.queryid, s.toplevel, s.query, s.calls, s.rows, s.total_exec_time, "
            "s.total_plan_time, s.shared_blks_hit + s.local_blks_hit, s.shared_blks_dirtied, "
            "s.wal_bytes FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
            "WHERE (CAST(:database AS text) IS NULL OR d.datname = :database) "
            "AND s.query NOT ILIKE '%pg_stat_statements%'"
        ),
        {"database": database},
    ).all()
    return {
        (int(row[0]), bool(row[1])): StatementStats(
            row[2],
            bool(row[1]),
            *(int(v) for v in row[3:5]),
            float(row[5]),
            float(row[6]),
            *(int(v) for v in row[7:10]),
        )
        for row in rows
    }


def statements_between(before: StatementsReading, after: StatementsReading) -> list[StatementStats]:
    """What ran between two readings: each entry's difference, those with calls, most
    execution time first."""
    zero = StatementStats("", False, 0, 0, 0.0, 0.0, 0, 0, 0)
    ran = [stats - before.get(key, zero) for key, stats in after.items()]
    return sorted((s for s in ran if s.calls > 0), key=lambda s: -(s.exec_ms + s.plan_ms))


def statement_calls(conn: sa.Connection, database: str | None = None) -> int:
    """Top-level statements run so far (``pg_stat_statements`` calls) in ``database``."""
    return sum(s.calls for s in read_statements(conn, database).values() if s.toplevel)


def reset_statements(conn: sa.Connection) -> None:
    conn.execute(sa.text("SELECT pg_stat_statements_reset()"))
    conn.commit()


def _short(query: str, width: int) -> str:
    text = " ".join(query.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def format_statements(
    ran: Sequence[StatementStats], messages: int, *, top: int = 25, width: int = 110
) -> list[str]:
    """Markdown rows of the ``top`` statements of ``ran`` by time: per message, calls,
    execution + planning ms, rows, buffers hit and dirtied, WAL bytes; then the sums of
    the top-level statements (``nested``: run inside a trigger function, its time also
    in its caller's)."""
    lines = [
        "| level | calls/msg | ms/msg | ms/call | rows/call | blocks hit/msg | dirtied/msg "
        "| WAL B/msg | statement |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for s in ran[:top]:
        ms = s.exec_ms + s.plan_ms
        lines.append(
            f"| {'top' if s.toplevel else 'nested'} | {s.calls / messages:.3f} | "
            f"{ms / messages:.4f} | {ms / s.calls:.3f} | {s.rows / s.calls:.1f} | "
            f"{s.blocks_hit / messages:.1f} | {s.blocks_dirtied / messages:.2f} | "
            f"{s.wal_bytes / messages:,.0f} | `{_short(s.query, width)}` |"
        )
    toplevel = [s for s in ran if s.toplevel]
    ms = sum(s.exec_ms + s.plan_ms for s in toplevel)
    lines.append(
        f"| top, all {len(toplevel)} | {sum(s.calls for s in toplevel) / messages:.3f} | "
        f"{ms / messages:.4f} | | | {sum(s.blocks_hit for s in toplevel) / messages:.1f} | "
        f"{sum(s.blocks_dirtied for s in toplevel) / messages:.2f} | "
        f"{sum(s.wal_bytes for s in toplevel) / messages:,.0f} | (every top-level statement) |"
    )
    return lines
