"""SQLite, the embedded default: one database file in the data dir.

``INSERT ... ON CONFLICT`` inside ``BEGIN IMMEDIATE`` write transactions, WAL, a busy
timeout, foreign keys on (docs/design.md "Stores"); full-text search through the FTS5
external-content table ``failed_messages_fts`` over the terms the process wrote in
``failed_messages.search_vector`` (migration 0009); leases as rows.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import threading
import time
import warnings
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote

import sqlalchemy as sa
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.sql import operators
from sqlalchemy.sql.expression import UnaryExpression

from controlroom.db.providers._base import (
    AUDIT_PURGE_CHUNK,
    OnConflictProvider,
    Row,
    SearchQuery,
    SearchTerms,
)
from controlroom.db.transactions import WRITE_OPTION, begin_write
from controlroom.exceptions import ConfigurationError, ErrorKind
from controlroom.runtime import file_locks
from controlroom.runtime.lease import Lease

# Central's schema (db/tables.py, and db/leases.py over it) is imported by the hooks that
# use it, not here: the site agent's own store runs on this provider and loads none of it.

BUSY_TIMEOUT_SECONDS = 30

WAL_CHECKPOINT_BYTES = 64 * 2**20
"""A writer's commit that leaves the write-ahead log larger than this (bytes) is followed
by a checkpoint that copies the log back and truncates it; also the size a log is cut
back to when SQLite starts it over (``journal_size_limit``). docs/decisions.md "SQLite's
write-ahead log is checkpointed by the writer"."""

WAL_CHECKPOINT_WAIT_SECONDS = 2.0
"""How long that checkpoint waits for the reads that began before it (seconds); past it
the log stays as it is until the next writer's commit tries again."""

_WROTE = "controlroom_wrote"  # connection record info: this connection began a write
_TURN = "controlroom_turn"  # connection record info: the writers' turn it holds
_SHORTENED = "controlroom_busy_shortened"  # record info: its busy timeout is what was left
_TURN_WAIT_UNSAID = 0.05  # seconds waited for the turn that leave the busy timeout whole
_log = logging.getLogger(__name__)
_TRANSIENT_MARKERS = ("database is locked", "database is busy", "disk i/o error")

FTS_TOKENIZER = "unicode61 remove_diacritics 0 categories 'L* M* N* P* S* Co'"
"""The tokenizer of ``failed_messages_fts`` (migration 0009): every character of a term
(letters, marks, digits, punctuation, symbols) is a token character, so the terms the
process wrote, space separated, are indexed as they are; only white space separates."""

# The FTS table's rowid is failed_messages.rowid (content_rowid in migration 0009).
_FTS_TABLE = sa.table("failed_messages_fts", sa.column("rowid"))
_FTS_TABLE_NAME: sa.ColumnClause[Any] = sa.literal_column(
    "failed_messages_fts"
)  # MATCH against the whole table
_ROWID: sa.ColumnClause[Any] = sa.literal_column("failed_messages.rowid")

# The hits of one full-text query among the rowids of SAMPLE_WINDOWS windows: the
# windows' starts a JSON array, each window ``:width`` rowids wide. CROSS JOIN keeps the
# windows outside, so FTS5 seeks each window's rowid range (it answers rowid bounds
# itself) instead of reading every hit and testing it against the windows.
_SAMPLED_HIT_ROWIDS = (
    "SELECT failed_messages_fts.rowid FROM json_each(:starts) AS sample "
    "CROSS JOIN failed_messages_fts WHERE failed_messages_fts MATCH :query "
    "AND failed_messages_fts.rowid >= sample.value "
    "AND failed_messages_fts.rowid < sample.value + :width"
)
_SAMPLED_HITS = sa.text(f"SELECT count(*) FROM ({_SAMPLED_HIT_ROWIDS})")
SAMPLE_WINDOWS = 8
"""Windows of rowids ``estimate_search_hits`` counts hits in, spread evenly over the
table's rowids (rowids follow insertion order: evenly spread windows see every period
of the table's history, not only its oldest rows)."""
SAMPLE_FRACTION = 0.03
"""The share of the table's rowids the windows cover together: 3 % of 200,000 rowids
estimated 57,218 hits as 56,233 and 45,547 as 45,900 (``benchmarks/query.py``), in about
1 ms where counting every hit took 22 ms."""
FILTERED_SAMPLE_HITS = 2_000
"""About how many sampled hits ``estimate_search_hits`` tests a filter on (each one's
table row read): the windows narrowed from their start to hold about that many. At
1,000,000 messages, 200,943 Unresolved of 286,900 hits were estimated as 199,971 from
about 2,000 sampled hits in 3 ms warm (10 ms the first time), where testing the 8,607
hits of the full windows took 14 ms warm and 0.2 s cold, and counting every match 0.57 s
(``benchmarks/README.md``, ``views_http.py``)."""

# Created by migration 0005 on SQLite only: the audit purge's permit (_purge_permit).
_AUDIT_PURGE_PERMITS = sa.table("audit_purge_permits", sa.column("id"))
# The first month the audit purge keeps, as stored instants' text: now (SQLite's clock)
# minus the longer of the retention asked for and the policy's floor (migration 0019).
_FIRST_MONTH_KEPT = sa.text(
    "SELECT strftime('%Y-%m-01 00:00:00', 'now', '-' || max(:days, coalesce("
    "(SELECT min_retention_days FROM audit_log_policy WHERE id = 1), 1)) || ' days')"
)
# In chain order: a month cut short (a chunk per transaction) lacks only its first events.
_EXPIRED_EVENTS = sa.text(
    "SELECT event_id FROM audit_log WHERE occurred_at_utc < :kept_from "
    "ORDER BY chain_month, chain_seq LIMIT :rows"
)
# SQLite calls the progress handler every this many virtual machine instructions.
_PROGRESS_STEPS = 1000


@contextmanager
def _purge_permit(conn: sa.Connection) -> Iterator[None]:
    """Inside the block, ``conn``'s transaction may DELETE audit events of months past the
    policy's retention (migration 0019's trigger). Write transactions are serialized
    (BEGIN IMMEDIATE) and the permit is gone before the commit, so no other connection
    ever sees one; a connection that inserts one itself still deletes only those months."""
    conn.execute(sa.insert(_AUDIT_PURGE_PERMITS).values(id=1))
    try:
        yield
    finally:
        if conn.in_transaction() and not conn.invalidated:
            conn.execute(sa.delete(_AUDIT_PURGE_PERMITS))


def fts_query(query: SearchQuery) -> str:
    """The FTS5 query of ``query``: each term a quoted string (inside quotes FTS5 reads
    nothing as syntax: ``AND``, ``NEAR``, ``*``, ``^``, ``col:``, parentheses; the only
    special character, ``"``, is doubled), a prefix followed by `` *`` (FTS5's prefix
    query: any token starting with it); an alternative's terms implicitly ANDed, the
    alternatives in parentheses joined by ``OR``. The index's tokenizer keeps each term
    whole (``FTS_TOKENIZER``), so each is one token. Empty when ``query`` is."""
    conjunctions = [_fts_terms(terms) for terms in query.alternatives]
    conjunctions = [conjunction for conjunction in conjunctions if conjunction]
    if len(conjunctions) == 1:
        return conjunctions[0]
    return " OR ".join(f"({conjunction})" for conjunction in conjunctions)


def _fts_terms(terms: SearchTerms) -> str:
    quoted = ['"' + term.replace('"', '""') + '"' for term in terms.words]
    quoted += ['"' + term.replace('"', '""') + '" *' for term in terms.prefixes]
    return " ".join(quoted)


_IN_MEMORY = (
    "an in-memory SQLite database is one connection's own: serve's connections and "
    "workers would each see an empty store of their own; name a file"
)


_NO_FILE_URI = (
    "with uri=true SQLite reads a path as a URI only when it starts with file: "
    "(sqlite:///file:/absolute/path.db?mode=rw&uri=true); any other path is a file's "
    "name, its query included"
)


def _reads_uri(url: sa.URL) -> bool:
    """Whether the driver is given ``url``'s path as an SQLite URI (``uri=true``,
    as SQLAlchemy's pysqlite dialect coerces it)."""
    return str(url.query.get("uri", "")).lower() in {"true", "1", "yes", "on"}


def _file_path(url: sa.URL) -> Path | None:
    """The store's file as SQLite opens it from ``url``; None for its in-memory database.
    With ``uri=true`` the path is a ``file:`` URI (https://sqlite.org/uri.html: an empty
    or ``localhost`` authority, the path percent-decoded); its query is no part of it."""
    database = url.database or ""
    if _reads_uri(url) and database.startswith("file:"):
        if url.query.get("mode") == "memory":
            return None
        database = unquote(database.removeprefix("file:").split("?", 1)[0].split("#", 1)[0])
        if database.startswith("//"):
            authority, _, path = database[2:].partition("/")
            database = "/" + path if authority in ("", "localhost") else database
    if database in ("", ":memory:"):
        return None
    return Path(database)


class SQLiteProvider(OnConflictProvider):
    name: ClassVar[str] = "sqlite"
    max_bound_parameters: ClassVar[int] = 32766  # SQLITE_MAX_VARIABLE_NUMBER since 3.32
    alters_tables_in_batch: ClassVar[bool] = True
    bounds_merged_walks: ClassVar[bool] = False  # its compound ORDER BY merges lazily

    def insert(self, table: sa.Table) -> Any:
        return insert(table)

    def bound_rows(self, table: sa.Table, names: Sequence[str]) -> sa.Subquery:
        # SELECT json_extract(value, '$[i]') ... FROM json_each(:rows): the rows as one
        # JSON array of arrays.
        each = sa.func.json_each(sa.bindparam("rows", type_=sa.Text)).table_valued("value")
        values = [
            sa.func.json_extract(
                each.c.value, sa.literal_column(f"'$[{index}]'"), type_=table.c[name].type
            ).label(name)
            for index, name in enumerate(names)
        ]
        return sa.select(*values).subquery("given")

    def bound_rows_parameters(self, names: Sequence[str], rows: Sequence[Row]) -> dict[str, Any]:
        return {"rows": json.dumps([[row[name] for name in names] for row in rows])}

    def materialized_cte(self, query: sa.Select[Any], name: str) -> sa.CTE:
        # SQLite (since 3.35) may flatten a CTE into its reader unless marked MATERIALIZED.
        return query.cte(name).prefix_with("MATERIALIZED")

    def fenced(self, query: sa.Select[Any], name: str) -> sa.Subquery:
        # A subquery with a LIMIT (-1: none) is not flattened into a reader that has one
        # of its own (the query flattener's rule that they may not both use LIMIT), and
        # SQLite runs it as a co-routine whose rows stream into the reader's sorter, where
        # a MATERIALIZED CTE writes every row to a temporary table first.
        return query.limit(sa.literal_column("-1")).offset(sa.literal_column("0")).subquery(name)

    def octet_length(self, text: sa.ColumnElement[Any]) -> sa.ColumnElement[int]:
        # A text cast to a blob is its bytes in the database's encoding, UTF-8 here
        # (SQLite's octet_length() came in 3.43; Debian 12 ships 3.40).
        return sa.func.length(sa.cast(text, sa.LargeBinary), type_=sa.Integer)

    def order_nulls_smallest(
        self, column: sa.ColumnElement[Any], *, descending: bool
    ) -> sa.ColumnElement[Any]:
        # SQLite's own order already puts NULL smallest; said explicitly, so the statement
        # reads the same on every provider that accepts NULLS FIRST/LAST.
        return column.desc().nulls_last() if descending else column.asc().nulls_first()

    def is_one_of(
        self, column: sa.ColumnElement[Any], values: Sequence[Any]
    ) -> sa.ColumnElement[bool]:
        each = sa.func.json_each(sa.literal(json.dumps(list(values)), sa.Text)).table_valued(
            "value"
        )
        return column.in_(sa.select(each.c.value))

    def list_elements(self, values: sa.ColumnElement[Any]) -> Any:
        return sa.func.json_each(values).table_valued("value")

    def list_length(self, values: sa.ColumnElement[Any]) -> sa.ColumnElement[int]:
        return sa.func.json_array_length(values, type_=sa.Integer)

    def aggregate_list(self, values: sa.Select[Any]) -> sa.ColumnElement[Any]:
        # json_group_array takes the rows in the order the subquery yields them.
        ordered = values.subquery()
        column = next(iter(ordered.c))
        return (
            sa.select(sa.func.json_group_array(column, type_=sa.JSON))
            .select_from(ordered)
            .scalar_subquery()
        )

    def search_matches(
        self, query: SearchQuery, *, among: sa.Select[Any] | None = None
    ) -> sa.ColumnElement[bool]:
        """The rowid among the hits of ``fts_query(terms)``, read once per statement into
        a set; given ``among``, only the hits within the rowid range of its rows (FTS5
        answers a rowid range from its doclists). At 1,000,000 messages, for the 490 rows
        of a broad search's first page: the hits of their range 1 ms, every hit 54 ms,
        a lookup in FTS5 per row 146 ms (``benchmarks/README.md``)."""
        text = fts_query(query)
        if not text:
            return sa.false()  # FTS5 refuses an empty query string
        hits = sa.select(_FTS_TABLE.c.rowid).where(
            _FTS_TABLE_NAME.op("MATCH")(sa.literal(text, sa.Text))
        )
        if among is not None:
            tested = among.with_only_columns(
                _ROWID.label("tested"), maintain_column_froms=True
            ).subquery("tested")
            hits = hits.where(
                _FTS_TABLE.c.rowid.between(
                    sa.select(sa.func.min(tested.c.tested)).scalar_subquery(),
                    sa.select(sa.func.max(tested.c.tested)).scalar_subquery(),
                )
            )
        return _ROWID.in_(hits)

    def count_search_hits(self, conn: sa.Connection, query: SearchQuery, limit: int) -> int:
        """From ``failed_messages_fts`` alone: FTS5 yields hits one by one in rowid order,
        so stopping at ``limit + 1`` reads that many doclist entries, where counting
        through the table seeks each hit's row (10,001 random rows of a 2 GB file took
        130 ms, the same count from FTS5 2 ms; ``benchmarks/query.py``)."""
        text = fts_query(query)
        if not text:
            return 0
        hits = (
            sa.select(sa.literal(1))
            .select_from(_FTS_TABLE)
            .where(_FTS_TABLE_NAME.op("MATCH")(sa.literal(text, sa.Text)))
            .limit(limit + 1)
            .subquery("hits")
        )
        return int(conn.execute(sa.select(sa.func.count()).select_from(hits)).scalar_one())

    def estimate_search_hits(
        self,
        conn: sa.Connection,
        query: SearchQuery,
        where: Sequence[sa.ColumnElement[bool]] = (),
    ) -> int:
        """The hits in ``SAMPLE_WINDOWS`` windows of rowids covering ``SAMPLE_FRACTION`` of
        the table's rowid range, scaled to the whole range. Gaps in the rowids (deleted
        messages) are in the windows as in the range, so they cancel out. Every hit of a
        range too small for the windows is counted. FTS5 keeps no count of a query's
        hits, and a term's document count (``fts5vocab``) reads that term's whole doclist:
        15 ms for a term in 150,000 of 200,000 messages, a sample of both terms 1 ms.

        With ``where``, the hits whose rows also meet it: the windows narrowed from their
        start to hold about ``FILTERED_SAMPLE_HITS`` hits, each hit's row looked up by
        rowid and tested (the conditions kept from every index, as a truth test: SQLite,
        without statistics, would otherwise read the status's index whole)."""
        from controlroom.db.tables import failed_messages  # central's schema: see the imports

        text = fts_query(query)
        if not text:
            return 0
        # The rowid b-tree's two ends, each its own aggregate: SQLite reads one end for a
        # lone min() or max(), but scans the table for both in one (0.3-0.6 s at 1,000,000).
        low, high = conn.execute(
            sa.select(
                sa.select(sa.func.min(_ROWID)).select_from(failed_messages).scalar_subquery(),
                sa.select(sa.func.max(_ROWID)).select_from(failed_messages).scalar_subquery(),
            )
        ).one()
        if low is None:
            return 0
        span: int = high - low + 1
        width = max(1, math.ceil(span * SAMPLE_FRACTION / SAMPLE_WINDOWS))
        if width * SAMPLE_WINDOWS >= span:
            starts, width = [low], span
        else:
            starts = [low + span * index // SAMPLE_WINDOWS for index in range(SAMPLE_WINDOWS)]
        sampled: int = conn.execute(
            _SAMPLED_HITS, {"starts": json.dumps(starts), "query": text, "width": width}
        ).scalar_one()
        if not where or not sampled:
            return round(sampled * span / (len(starts) * width))
        width = max(1, min(width, math.ceil(width * FILTERED_SAMPLE_HITS / sampled)))
        hits = (
            sa.text(_SAMPLED_HIT_ROWIDS)
            .bindparams(starts=json.dumps(starts), query=text, width=width)
            .columns(sa.column("rowid", sa.Integer))
            .subquery("sampled")
        )
        kept: int = conn.execute(
            sa.select(sa.func.count())
            .select_from(failed_messages)
            .where(_ROWID.in_(sa.select(hits.c.rowid)), sa.and_(*where).is_(sa.true()))
        ).scalar_one()
        return round(kept * span / (len(starts) * width))

    def without_index(self, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        # A unary "+" keeps a term from constraining an index (SQLite's query planner
        # documentation, "Disqualifying WHERE clause terms using unary-+"). Without
        # statistics SQLite takes any equality on an indexed column for selective: 70 %
        # of 1,000,000 rows read by their status index and sorted (benchmarks/README.md).
        operand = column.self_group()  # parenthesized when it is an expression
        return UnaryExpression(operand, operator=operators.custom_op("+"), type_=column.type)

    def make_lease(self, engine: sa.Engine, name: str, owner: str, seconds: float) -> Lease:
        from controlroom.db.leases import LeaseRow  # central's schema: see the imports

        return LeaseRow(self, engine, name, owner, seconds)

    def url_problem(self, url: sa.URL) -> str | None:
        if _reads_uri(url) and not (url.database or "").startswith("file:"):
            return _NO_FILE_URI
        if _file_path(url) is None:
            return _IN_MEMORY
        # SQLAlchemy's own reading of the query: what it warns it ignores (SQLite's URI
        # options without uri=true: ?mode=ro, and the store written anyway) or cannot read.
        with warnings.catch_warnings():
            warnings.simplefilter("error", sa.exc.SAWarning)
            try:
                url.get_dialect()().create_connect_args(url)
            except sa.exc.SAWarning:
                return (
                    "the SQLite driver ignores options in its query: SQLite's URI options "
                    "(mode=ro, cache=shared) need uri=true"
                )
            except (ValueError, TypeError):
                return "the SQLite driver cannot read its query's options"
        return None

    def create_engine(self, url: sa.URL, *, pool_size: int) -> sa.Engine:
        path = _file_path(url)
        if path is None:
            raise ConfigurationError(_IN_MEMORY)
        mode = url.query.get("mode") if _reads_uri(url) else None
        if mode in ("ro", "rw") and not path.exists():
            raise ConfigurationError(
                f"the database file {path} does not exist: with mode={mode} SQLite opens only "
                "a file that exists (without mode it makes one)"
            )
        directory = path.parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot make the database's directory {directory}: {exc.strerror}"
            ) from exc
        # hide_parameters: errors (and the retry warnings that log them) never carry the
        # bound values, which are message bodies and headers (docs/decisions.md "Store errors
        # never carry message data").
        engine = sa.create_engine(
            url,
            connect_args={"timeout": BUSY_TIMEOUT_SECONDS, "check_same_thread": False},
            hide_parameters=True,
        )

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
            # Take over transaction control from the sqlite3 module so BEGIN is ours.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA journal_size_limit={WAL_CHECKPOINT_BYTES}")
            cursor.close()

        # The store's writers take turns, each with the checkpoint after its commit: a
        # checkpoint that truncates waits for every writer, and two batches written at once
        # gave up each other's (docs/decisions.md "SQLite's write-ahead log is
        # checkpointed by the writer"). SQLite lets one writer in at a time anyway.
        writers = _WritersTurn(path.with_name(f"{path.name}-turn"))

        @sa.event.listens_for(engine, "begin")
        def _on_begin(conn: sa.Connection) -> None:
            # A writer takes the lock up front instead of failing on upgrade.
            immediate = conn.get_execution_options().get(WRITE_OPTION, False)
            if immediate:
                # Past a busy timeout SQLite's own wait decides, as without the turn. The
                # turn's wait counts against the busy timeout: with the store locked by
                # another process, writers that queued for their turn would otherwise
                # each wait a whole one after the other.
                began = time.monotonic()
                if writers.take(timeout=BUSY_TIMEOUT_SECONDS):
                    conn.info[_TURN] = writers
                waited = time.monotonic() - began
                if waited > _TURN_WAIT_UNSAID:
                    left = max(1, round((BUSY_TIMEOUT_SECONDS - waited) * 1000))
                    conn.exec_driver_sql(f"PRAGMA busy_timeout={left}")
                    conn.info[_SHORTENED] = True
                conn.info[_WROTE] = True
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        wal = path.with_name(f"{path.name}-wal")

        @sa.event.listens_for(engine, "checkin")
        def _on_checkin(
            dbapi_connection: sqlite3.Connection | None, record: ConnectionPoolEntry
        ) -> None:
            # After the writer's transaction ended, before its caller acknowledges.
            turn = record.info.pop(_TURN, None)
            try:
                if record.info.pop(_SHORTENED, False) and dbapi_connection is not None:
                    dbapi_connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_SECONDS * 1000}")
                if record.info.pop(_WROTE, False) and dbapi_connection is not None:
                    _checkpoint_if_past_bound(dbapi_connection, wal)
            finally:
                if turn is not None:
                    turn.give()

        return engine

    def purge_audit_log(
        self, engine: sa.Engine, retention_days: int, *, chunk: int = AUDIT_PURGE_CHUNK
    ) -> tuple[int, datetime]:
        """Delete, ``chunk`` per transaction, the events before the first month kept (by
        SQLite's clock and the policy's floor), each transaction under a purge permit:
        migration 0019's trigger refuses any other DELETE, and any event of a month not
        wholly past the floor even under a permit."""
        from controlroom.db.tables import audit_log  # central's schema: see the imports

        deleted = 0
        while True:
            with begin_write(engine) as conn:
                kept_from = conn.execute(_FIRST_MONTH_KEPT, {"days": retention_days}).scalar_one()
                ids = (
                    conn.execute(_EXPIRED_EVENTS, {"kept_from": kept_from, "rows": chunk})
                    .scalars()
                    .all()
                )
                if ids:
                    with _purge_permit(conn):
                        conn.execute(sa.delete(audit_log).where(audit_log.c.event_id.in_(ids)))
            deleted += len(ids)
            if len(ids) < chunk:
                return deleted, datetime.fromisoformat(kept_from).replace(tzinfo=UTC)

    @contextmanager
    def limit_statement_time(self, conn: sa.Connection, seconds: float) -> Iterator[None]:
        # SQLite has no statement timeout: a progress handler that answers "stop" past
        # the deadline makes the running statement fail with "interrupted".
        deadline = time.monotonic() + seconds
        dbapi_connection = conn.connection.dbapi_connection
        assert dbapi_connection is not None
        dbapi_connection.set_progress_handler(lambda: time.monotonic() > deadline, _PROGRESS_STEPS)
        try:
            yield
        finally:
            dbapi_connection.set_progress_handler(None, _PROGRESS_STEPS)

    def store_identity(self, conn: sa.Connection) -> str:
        # The main database's file as SQLite opened it, by its device and inode: one for
        # every path to it (symbolic links, "..", hard links).
        path = next(
            row[2] for row in conn.exec_driver_sql("PRAGMA database_list") if row[1] == "main"
        )
        found = os.stat(path)
        return f"SQLite file, device {found.st_dev}, inode {found.st_ino}"

    def error_code(self, exc: BaseException) -> str | None:
        if not isinstance(exc, sqlite3.Error):
            return None
        name: str | None = getattr(exc, "sqlite_errorname", None)  # Python 3.11+
        return name

    def advice(self, exc: BaseException) -> str | None:
        # SQLITE_READONLY and its extended codes (https://sqlite.org/rescode.html).
        if (self.error_code(exc) or "").startswith("SQLITE_READONLY"):
            return (
                "open it without mode=ro or immutable in the URL, as a user that may write "
                "the file and its directory"
            )
        return None

    def classify_error(self, exc: BaseException) -> ErrorKind | None:
        if not isinstance(exc, sqlite3.Error):
            return None
        text = str(exc).lower()
        if any(marker in text for marker in _TRANSIENT_MARKERS):
            return ErrorKind.TRANSIENT
        if isinstance(exc, sqlite3.DataError):
            return ErrorKind.DATA
        # Of the constraints only the CHECKs are the input's: they bound text widths
        # (migration 0005). A NOT NULL or key violation is a bug of the writing code, as on
        # PostgreSQL (class 23 there is not data either).
        if getattr(exc, "sqlite_errorname", None) == "SQLITE_CONSTRAINT_CHECK":
            return ErrorKind.DATA
        return ErrorKind.FATAL

    def cancel_statement(self, dbapi_connection: Any) -> None:
        # sqlite3_interrupt: thread-safe; it ends a running statement, not a wait on the
        # busy timeout, which ends by itself (BUSY_TIMEOUT_SECONDS).
        dbapi_connection.interrupt()

    def file_url(self, path: Path) -> str:
        """The URL of the database file at ``path`` (the embedded default)."""
        return f"{self.name}:///{path.resolve()}"


PROVIDER = SQLiteProvider()


class _WritersTurn:
    """The turn of one store's writers, from ``BEGIN IMMEDIATE`` to after the checkpoint
    that follows the commit: a lock for the engine's threads and an ``flock`` on the
    file ``turn_path`` (made beside the database) for other processes' engines on the
    same database, as two intake workers are. Where files do not lock, or the file
    cannot be opened (a read-only directory), the turn is the process's alone."""

    _POLL_SECONDS = (0.001, 0.002, 0.005, 0.01)  # as SQLite's own busy handler begins

    def __init__(self, turn_path: Path) -> None:
        self._threads = threading.Lock()
        self._file: int | None = None
        if file_locks.LOCKS:
            try:
                self._file = os.open(turn_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                _log.info("the writers' turn is this process's alone: %s", exc)
                return
            weakref.finalize(self, os.close, self._file)

    def take(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the turn: True once taken; False when
        another writer held it all that time (the writer then goes on without it, and
        SQLite's busy timeout decides)."""
        deadline = time.monotonic() + timeout
        if not self._threads.acquire(timeout=timeout):
            return False
        if self._file is None:
            return True
        polls = iter(self._POLL_SECONDS)
        while not file_locks.try_hold(self._file):
            left = deadline - time.monotonic()
            if left <= 0:
                self._threads.release()
                return False
            time.sleep(min(next(polls, self._POLL_SECONDS[-1]), left))
        return True

    def give(self) -> None:
        """Give the turn taken by ``take`` back."""
        if self._file is not None:
            file_locks.release(self._file)
        self._threads.release()


def _checkpoint_if_past_bound(dbapi_connection: sqlite3.Connection, wal: Path) -> None:
    """Copy a write-ahead log larger than ``WAL_CHECKPOINT_BYTES`` back into the database
    and truncate it (``PRAGMA wal_checkpoint(TRUNCATE)``), waiting at most
    ``WAL_CHECKPOINT_WAIT_SECONDS`` for the reads begun before it. SQLite's own checkpoint
    after a commit never waits: while reads overlap every commit, as a console's do during
    a drain, it copies too little for the log to start over, and the log grows by every
    batch (docs/decisions.md "SQLite's write-ahead log is checkpointed by the writer").
    A checkpoint that could not finish, or failed, leaves the log to the next writer: the
    write it follows has committed either way."""
    try:
        if wal.stat().st_size <= WAL_CHECKPOINT_BYTES:
            return
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={round(WAL_CHECKPOINT_WAIT_SECONDS * 1000)}")
            busy, _, _ = cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_SECONDS * 1000}")
            cursor.close()
    except (OSError, sqlite3.Error) as error:
        _log.warning("checkpoint of %s not made: %s", wal, error)
        return
    if busy:
        _log.info(
            "checkpoint of %s waited for reads or another process's write and left the log "
            "to a later write",
            wal,
        )
