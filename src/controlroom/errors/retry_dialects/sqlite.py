"""SQLite: ``INSERT ... ON CONFLICT DO NOTHING`` claims (inside ``BEGIN IMMEDIATE``); a
time-limited lease row as the lease (DESIGN.md "Background singletons": a lease row
where there are no advisory locks)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.dialects.sqlite import insert

from controlroom.db.engine import begin_write
from controlroom.db.tables import service_leases
from controlroom.errors.retry_dialects._base import RetryBatchDialect

sl = service_leases.c


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
        statement = insert(service_leases).values(
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


DIALECT = RetryBatchDialect(name="sqlite", insert=insert, make_lease=LeaseRow)
