"""A store that refuses every write, as a full disk or a read-only database does: the
event log as much as the intake's tables (not a renamed table, which refuses one write);
and one whose writes wait, as while another writer holds the store."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from controlroom.db.engine import create_store_engine


@contextlib.contextmanager
def refusing_writes(engine: sa.Engine) -> Iterator[None]:
    """While inside, every connection of ``engine`` is read-only (SQLite: ``PRAGMA
    query_only``, "attempt to write a readonly database"; PostgreSQL: read-only
    transactions by default, "cannot execute INSERT in a read-only transaction"): each
    write raises the driver's error, as ``sa.exc.DBAPIError``. The pool is emptied on
    the way in and out, so no connection of the other kind is used."""

    def read_only(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        if engine.dialect.name == "sqlite":
            cursor.execute("PRAGMA query_only = ON")
        else:
            cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        cursor.close()
        dbapi_connection.commit()  # a rollback would undo PostgreSQL's SET

    engine.dispose()
    sa.event.listen(engine, "connect", read_only)
    try:
        yield
    finally:
        sa.event.remove(engine, "connect", read_only)
        engine.dispose()


@contextlib.contextmanager
def writes_held(database_url: str, table: str = "failed_messages") -> Iterator[None]:
    """While inside, another connection holds the store's writes: on SQLite an open
    ``BEGIN IMMEDIATE`` (writers wait on their busy timeout), on PostgreSQL ``table``
    locked in EXCLUSIVE mode (reads go on)."""
    url = sa.make_url(database_url)
    if url.get_backend_name() == "sqlite":
        assert url.database is not None
        with contextlib.closing(sqlite3.connect(url.database, isolation_level=None)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            finally:
                conn.execute("ROLLBACK")
        return
    engine = create_store_engine(database_url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
            try:
                yield
            finally:
                conn.rollback()
    finally:
        engine.dispose()
