"""Engines for every supported provider, with each provider's connection rules.

SQLite: WAL, a busy timeout, foreign keys on, and ``BEGIN IMMEDIATE`` for write
transactions (DESIGN.md "Stores"), so a writer takes the lock up front instead of failing
on upgrade. PostgreSQL: psycopg 3, pre-ping so a restarted server costs one retry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import sqlalchemy as sa
import tenacity
from sqlalchemy.engine import make_url

from controlroom.exceptions import UnsupportedProviderError, is_transient

SUPPORTED_PROVIDERS = ("sqlite", "postgresql")
_WRITE_OPTION = "controlroom_write"
T = TypeVar("T")
SQLITE_BUSY_TIMEOUT_SECONDS = 30


def normalize_database_url(url: str) -> sa.URL:
    """Parse ``url``, choosing psycopg 3 for PostgreSQL when no driver is named.

    Raises ``UnsupportedProviderError`` for a provider Controlroom does not support.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() not in SUPPORTED_PROVIDERS:
        raise UnsupportedProviderError(
            f"database provider {parsed.get_backend_name()!r} is not supported; "
            f"use one of {', '.join(SUPPORTED_PROVIDERS)}"
        )
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def create_store_engine(url: str, *, pool_size: int = 10) -> sa.Engine:
    """Create the engine for ``url`` with the provider's connection rules applied."""
    parsed = normalize_database_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _create_sqlite_engine(parsed)
    return sa.create_engine(parsed, pool_pre_ping=True, pool_size=pool_size, max_overflow=pool_size)


def _create_sqlite_engine(url: sa.URL) -> sa.Engine:
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(
        url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False}
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
        immediate = conn.get_execution_options().get(_WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


@contextmanager
def begin_write(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A write transaction: committed on success, rolled back on an exception.

    On SQLite it starts with ``BEGIN IMMEDIATE``; elsewhere it is a plain transaction.
    """
    with engine.connect().execution_options(**{_WRITE_OPTION: True}) as conn, conn.begin():
        yield conn


def run_write_transaction(engine: sa.Engine, work: Callable[[sa.Connection], T]) -> T:
    """``work(conn)`` in a write transaction, replayed whole (up to 3 times, short waits)
    when the store reports a transient error such as a deadlock or a serialization
    failure (DESIGN.md "Transient failures"). ``work`` must be safe to replay: it runs
    again from scratch on a fresh transaction. Other errors propagate at once.
    """
    for attempt in tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
        stop=tenacity.stop_after_attempt(3),
        reraise=True,
    ):
        with attempt, begin_write(engine) as conn:
            return work(conn)
    raise AssertionError("unreachable: tenacity either returns or reraises")
