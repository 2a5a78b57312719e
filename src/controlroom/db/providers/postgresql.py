"""PostgreSQL, the production provider: psycopg 3, ``INSERT ... ON CONFLICT``.

Full-text search through the ``search_vector`` column and its GIN index (migration
0001); leases as session-level advisory locks; SQLSTATE classification of errors
(DESIGN.md "Stores", "Transient failures").
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import REGCONFIG, TSVECTOR, insert

from controlroom.db.leases import lease_key
from controlroom.db.providers._base import Lease, OnConflictProvider
from controlroom.exceptions import ErrorKind

log = logging.getLogger(__name__)

# Must equal the configuration and the split pattern of migration 0001's search_vector.
TEXT_SEARCH_CONFIG = "simple"
SPLIT_PATTERN = "[^[:alnum:]]+"

# Memory for a search's bitmap of matching rows: at the default 4 MB, a term in 285,000
# of 1,000,000 rows made the bitmap lossy, and every row of a lossy page is rechecked
# against its detoasted search_vector (4 s instead of 1 s, benchmarks/query.py).
SEARCH_WORK_MEM = "64MB"

# Not modelled in db.tables (it exists on PostgreSQL only); a constant column name.
_SEARCH_VECTOR = sa.literal_column("failed_messages.search_vector", type_=TSVECTOR)

# SQLSTATE classes and codes that mean "try again": connection exceptions, serialization
# failure, deadlock, lock timeouts, admin shutdown, too many connections.
_TRANSIENT_SQLSTATE_PREFIXES = ("08", "40", "57P", "53")
_TRANSIENT_SQLSTATE_CODES = {"55P03", "57014"}
# Data exceptions (value too long, bad encoding, NUL) and program limits the input hit
# (a tsvector over 1 MB): the input is at fault, not the store.
_DATA_SQLSTATE_PREFIXES = ("22", "54")


class AdvisoryLockLease:
    """A lease held as a session-level ``pg_try_advisory_lock`` on a dedicated connection.

    The lock lives exactly as long as that connection: when the process dies or the
    connection breaks, the server releases it and another process can take over. The
    connection runs in autocommit so holding the lock never holds a transaction open.
    Advisory locks are per database, so separate databases never contend.
    """

    def __init__(self, engine: sa.Engine, name: str) -> None:
        self.name = name
        self._engine = engine
        self._key = lease_key(name)
        self._conn: sa.Connection | None = None

    def hold(self) -> bool:
        if self._conn is not None:
            if self._still_connected(self._conn):
                return True
            log.warning("lost the connection holding lease %r", self.name)
            self._discard()
        conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            acquired = conn.execute(sa.select(sa.func.pg_try_advisory_lock(self._key))).scalar_one()
        except BaseException:
            conn.invalidate()
            conn.close()
            raise
        if not acquired:
            conn.close()
            return False
        self._conn = conn
        return True

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.execute(sa.select(sa.func.pg_advisory_unlock(self._key)))
            conn.close()
        except sa.exc.DBAPIError:
            # Never return a connection that may still hold the lock to the pool.
            conn.invalidate()
            conn.close()

    @staticmethod
    def _still_connected(conn: sa.Connection) -> bool:
        try:
            conn.execute(sa.text("SELECT 1"))
        except sa.exc.DBAPIError:
            return False
        return True

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.invalidate()
            conn.close()


class PostgreSQLProvider(OnConflictProvider):
    name: ClassVar[str] = "postgresql"
    max_bound_parameters: ClassVar[int] = 65535  # the protocol's 16-bit parameter count

    def insert(self, table: sa.Table) -> Any:
        return insert(table)

    def search_matches(self, text: str) -> sa.ColumnElement[bool]:
        """Every part of ``text`` (split at non-alphanumerics, as the index was) must occur.

        Migration 0001 indexes headers and body text as written and with every run of
        non-alphanumeric characters replaced by a space. The query asks for the parts
        (``plainto_tsquery``: ANDed, read as plain words, a bound parameter), so a dotted
        name is found whole and by any part. Not a phrase: a phrase makes PostgreSQL
        recheck every candidate against its detoasted vector (seconds for a common term,
        ``benchmarks/query.py``); the parts alone are answered from the GIN index.
        """
        # Split in SQL, with the index's own pattern, so "alphanumeric" means the same.
        without_nul = text.replace("\x00", " ")  # text cannot hold NUL; changes no term
        parts = sa.func.regexp_replace(sa.literal(without_nul, sa.Text), SPLIT_PATTERN, " ", "g")
        query = sa.func.plainto_tsquery(sa.cast(TEXT_SEARCH_CONFIG, REGCONFIG), parts)
        return _SEARCH_VECTOR.bool_op("@@")(query)

    def prepare_search(self, conn: sa.Connection) -> None:
        """The planner does not know that ``@@`` detoasts each row's ``search_vector``:
        for a broad term it prefers scanning the whole table (5.7 s for a count over
        1,000,000 rows) to the GIN index (1 s). Without sequential scans it takes the
        index, or walks a sort key's index when a page needs only a few rows. ``SET
        LOCAL`` ends with the transaction."""
        conn.exec_driver_sql(f"SET LOCAL work_mem = '{SEARCH_WORK_MEM}'")
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")

    def make_lease(self, engine: sa.Engine, name: str, owner: str, seconds: float) -> Lease:
        # owner and seconds do not apply: the server knows the holder and its liveness.
        return AdvisoryLockLease(engine, name)

    def create_engine(self, url: sa.URL, *, pool_size: int) -> sa.Engine:
        # Pre-ping: a restarted server costs one retry, not a failed batch. hide_parameters:
        # errors (and the retry warnings that log them) never carry the bound values,
        # which are message bodies and headers (issue 14, item 10).
        return sa.create_engine(
            url,
            pool_pre_ping=True,
            pool_size=pool_size,
            max_overflow=pool_size,
            hide_parameters=True,
        )

    def normalize_url(self, url: sa.URL) -> sa.URL:
        if url.drivername in (self.name, "postgres"):
            return url.set(drivername=f"{self.name}+psycopg")
        return url

    def classify_error(self, exc: BaseException) -> ErrorKind | None:
        if not isinstance(exc, psycopg.Error):
            return None
        if isinstance(exc, psycopg.DataError) and exc.sqlstate is None:
            return ErrorKind.DATA  # refused by psycopg itself, e.g. a NUL in a text parameter
        sqlstate = exc.sqlstate
        if sqlstate is None:
            # No server answer at all: the connection failed or was lost.
            return (
                ErrorKind.TRANSIENT
                if isinstance(exc, psycopg.OperationalError)
                else ErrorKind.FATAL
            )
        if (
            sqlstate.startswith(_TRANSIENT_SQLSTATE_PREFIXES)
            or sqlstate in _TRANSIENT_SQLSTATE_CODES
        ):
            return ErrorKind.TRANSIENT
        if sqlstate.startswith(_DATA_SQLSTATE_PREFIXES):
            return ErrorKind.DATA
        return ErrorKind.FATAL

    def migration_lock(self, conn: sa.Connection) -> None:
        # Processes starting together against a fresh database migrate one after the
        # other; the lock ends with the transaction.
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(lease_key("controlroom-migrations"))))


PROVIDER = PostgreSQLProvider()
