"""Database leases: exactly one process runs each background singleton.

Source: docs/design.md "Background singletons take a database lease (PostgreSQL advisory
lock; a lease row elsewhere) so that exactly one process runs each when several are
deployed". Each provider makes its own kind (``Provider.make_lease``); the lease row here
serves every provider without a server-side lock.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import sqlalchemy as sa

from controlroom.db.tables import service_leases
from controlroom.db.transactions import begin_write

if TYPE_CHECKING:
    from controlroom.db.providers._base import Provider

sl = service_leases.c


def lease_key(name: str) -> int:
    """A signed 64-bit key for lease ``name`` (first 8 bytes of SHA-256), for providers
    whose locks are numbered."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


class LeaseRow:
    """A lease kept as a ``service_leases`` row: ``owner`` holds it until ``expires_at``.

    ``hold()`` takes the row when it is absent, expired or already ours, pushing the
    expiry ``seconds`` ahead, in one upsert; a process that stops renewing loses the
    lease at expiry. Times come from the wall clock of the machines sharing the database.
    """

    def __init__(
        self, provider: Provider, engine: sa.Engine, name: str, owner: str, seconds: float
    ) -> None:
        if seconds <= 0:
            raise ValueError("a lease must last a positive number of seconds")
        self.name = name
        self._provider = provider
        self._engine = engine
        self._owner = owner
        self._duration = timedelta(seconds=seconds)

    def hold(self) -> bool:
        now = datetime.now(UTC)
        statement = self._provider.upsert(
            service_leases,
            key=[sl.name],
            set_=lambda incoming: {"owner": incoming.owner, "expires_at": incoming.expires_at},
            where=lambda _incoming: sa.or_(sl.owner == self._owner, sl.expires_at < now),
        ).values(name=self.name, owner=self._owner, expires_at=now + self._duration)
        with begin_write(self._engine) as conn:
            conn.execute(statement)
            holder: str = conn.execute(sa.select(sl.owner).where(sl.name == self.name)).scalar_one()
        return holder == self._owner

    def release(self) -> None:
        with begin_write(self._engine) as conn:
            conn.execute(
                sa.delete(service_leases).where(sl.name == self.name, sl.owner == self._owner)
            )
