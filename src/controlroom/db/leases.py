"""Database leases: exactly one process runs each background singleton.

Source: DESIGN.md "Background singletons take a database lease (PostgreSQL advisory
lock; a lease row elsewhere) so that exactly one process runs each when several are
deployed". ``make_lease`` picks the provider's kind.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from controlroom.db.engine import begin_write
from controlroom.db.tables import service_leases
from controlroom.exceptions import UnsupportedProviderError

log = logging.getLogger(__name__)
sl = service_leases.c


class Lease(Protocol):
    """A lease that lets exactly one process run a background singleton.

    ``hold()`` acquires the lease, or confirms and renews it when already held, and
    returns whether this process holds it now; a ``False`` after a ``True`` means the
    lease was lost (the holder must stop its work). ``release()`` gives it up; idempotent.
    Both block (database I/O): call them off the event loop. Store errors propagate.
    """

    name: str

    def hold(self) -> bool: ...

    def release(self) -> None: ...


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


class LeaseRow:
    """A lease kept as a ``service_leases`` row: ``owner`` holds it until ``expires_at``.

    ``hold()`` takes the row when it is absent, expired or already ours, pushing the
    expiry ``seconds`` ahead, in one upsert; a process that stops renewing loses the
    lease at expiry. Times come from the wall clock of the one machine that shares the
    SQLite file.
    """

    def __init__(self, engine: sa.Engine, name: str, owner: str, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError("a lease must last a positive number of seconds")
        self.name = name
        self._engine = engine
        self._owner = owner
        self._duration = timedelta(seconds=seconds)

    def hold(self) -> bool:
        now = datetime.now(UTC)
        statement = sqlite_insert(service_leases).values(
            name=self.name, owner=self._owner, expires_at=now + self._duration
        )
        statement = statement.on_conflict_do_update(
            index_elements=[sl.name],
            set_={"owner": statement.excluded.owner, "expires_at": statement.excluded.expires_at},
            where=sa.or_(sl.owner == self._owner, sl.expires_at < now),
        )
        with begin_write(self._engine) as conn:
            conn.execute(statement)
            holder = conn.execute(sa.select(sl.owner).where(sl.name == self.name)).scalar_one()
        return holder == self._owner

    def release(self) -> None:
        with begin_write(self._engine) as conn:
            conn.execute(
                sa.delete(service_leases).where(sl.name == self.name, sl.owner == self._owner)
            )


_LEASES: dict[str, Callable[[sa.Engine, str, str, float], Lease]] = {
    "postgresql": AdvisoryLockLease,
    "sqlite": LeaseRow,
}


def make_lease(engine: sa.Engine, name: str, owner: str, seconds: float) -> Lease:
    """The lease ``name`` for ``owner`` on ``engine``'s provider.

    ``seconds`` is how long a lease row outlives an owner that stopped renewing it (an
    advisory lock needs none: it dies with its connection). Raises
    ``UnsupportedProviderError`` for a provider without leases.
    """
    try:
        kind = _LEASES[engine.dialect.name]
    except KeyError:
        raise UnsupportedProviderError(f"no lease for provider {engine.dialect.name!r}") from None
    return kind(engine, name, owner, seconds)
