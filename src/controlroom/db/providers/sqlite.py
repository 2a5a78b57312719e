"""SQLite, the embedded default: one database file in the data dir.

``INSERT ... ON CONFLICT`` inside ``BEGIN IMMEDIATE`` write transactions, WAL, a busy
timeout, foreign keys on (DESIGN.md "Stores"); full-text search through the FTS5
external-content table ``failed_messages_fts`` (migration 0001); leases as rows.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects.sqlite import insert

from controlroom.db.leases import LeaseRow
from controlroom.db.providers._base import Lease, OnConflictProvider
from controlroom.db.transactions import WRITE_OPTION
from controlroom.exceptions import ErrorKind

BUSY_TIMEOUT_SECONDS = 30
_TRANSIENT_MARKERS = ("database is locked", "database is busy", "disk i/o error")

# The FTS table's rowid is failed_messages.rowid (content_rowid in migration 0001).
_FTS_TABLE = sa.table("failed_messages_fts", sa.column("rowid"))
_FTS_TABLE_NAME = sa.literal_column("failed_messages_fts")  # MATCH against the whole table
_ROWID = sa.literal_column("failed_messages.rowid")


def fts_query(text: str) -> str:
    """The FTS5 query for the user's ``text``: each word a quoted phrase, implicitly ANDed.

    FTS5's ``unicode61`` tokenizer splits at every character that is not a letter or
    digit, so ``System.InvalidOperationException`` is indexed as two adjacent terms; as a
    quoted phrase it is found whole, and a part alone is found too. Inside a quoted phrase
    FTS5 reads nothing as syntax (``AND``, ``NEAR``, ``*``, ``^``, ``col:``, parentheses);
    the only special character, ``"``, is doubled. Words are split at whitespace (NUL
    counts as whitespace). Empty when ``text`` has no word.
    """
    words = text.replace("\x00", " ").split()
    return " ".join('"' + word.replace('"', '""') + '"' for word in words)


class SQLiteProvider(OnConflictProvider):
    name: ClassVar[str] = "sqlite"
    max_bound_parameters: ClassVar[int] = 32766  # SQLITE_MAX_VARIABLE_NUMBER since 3.32
    alters_tables_in_batch: ClassVar[bool] = True

    def insert(self, table: sa.Table) -> Any:
        return insert(table)

    def search_matches(self, text: str) -> sa.ColumnElement[bool]:
        query = fts_query(text)
        if not query:
            return sa.false()  # FTS5 refuses an empty query string
        hits = sa.select(_FTS_TABLE.c.rowid).where(
            _FTS_TABLE_NAME.op("MATCH")(sa.literal(query, sa.Text))
        )
        return _ROWID.in_(hits)

    def make_lease(self, engine: sa.Engine, name: str, owner: str, seconds: float) -> Lease:
        return LeaseRow(self, engine, name, owner, seconds)

    def create_engine(self, url: sa.URL, *, pool_size: int) -> sa.Engine:
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        # hide_parameters: errors (and the retry warnings that log them) never carry the
        # bound values, which are message bodies and headers (issue 14, item 10).
        engine = sa.create_engine(
            url,
            connect_args={"timeout": BUSY_TIMEOUT_SECONDS, "check_same_thread": False},
            hide_parameters=True,
        )

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
            # Take over transaction control from the sqlite3 module so BEGIN is ours.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @sa.event.listens_for(engine, "begin")
        def _on_begin(conn: sa.Connection) -> None:
            # A writer takes the lock up front instead of failing on upgrade.
            immediate = conn.get_execution_options().get(WRITE_OPTION, False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine

    def classify_error(self, exc: BaseException) -> ErrorKind | None:
        if not isinstance(exc, sqlite3.Error):
            return None
        text = str(exc).lower()
        if any(marker in text for marker in _TRANSIENT_MARKERS):
            return ErrorKind.TRANSIENT
        if isinstance(exc, (sqlite3.DataError, sqlite3.IntegrityError)):
            return ErrorKind.DATA
        return ErrorKind.FATAL

    def file_url(self, path: Path) -> str:
        """The URL of the database file at ``path`` (the embedded default)."""
        return f"{self.name}:///{path.resolve()}"


PROVIDER = SQLiteProvider()
