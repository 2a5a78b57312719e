"""A store that refuses every write, as a full disk or a read-only database does: the
event log as much as the intake's tables (not a renamed table, which refuses one write)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa


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
