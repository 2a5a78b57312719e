"""PostgreSQL: ``INSERT ... ON CONFLICT DO NOTHING`` claims; a session advisory lock as
the lease (DESIGN.md "Background singletons")."""

from __future__ import annotations

import hashlib
import logging

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert

from controlroom.errors.retry_dialects._base import RetryBatchDialect

log = logging.getLogger(__name__)


def advisory_lock_key(name: str) -> int:
    """The signed 64-bit advisory-lock key of lease ``name`` (first 8 bytes of SHA-256)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


class AdvisoryLockLease:
    """A lease held as a session-level ``pg_try_advisory_lock`` on a dedicated connection.

    The lock lives exactly as long as that connection: when the process dies or the
    connection breaks, PostgreSQL releases it and another process can take over. The
    connection runs in autocommit so holding the lock never holds a transaction open.
    Advisory locks are per database, so separate databases never contend.
    """

    def __init__(self, engine: sa.Engine, name: str, owner: str, seconds: float) -> None:
        # owner and seconds do not apply: the server knows the holder and its liveness.
        self.name = name
        self._engine = engine
        self._key = advisory_lock_key(name)
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


DIALECT = RetryBatchDialect(name="postgresql", insert=insert, make_lease=AdvisoryLockLease)
