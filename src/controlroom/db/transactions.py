"""Write transactions, the same on every provider: ``begin_write``.

A provider that must take its write lock up front (SQLite's ``BEGIN IMMEDIATE``) reads
``WRITE_OPTION`` from the connection's execution options when the transaction begins.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

WRITE_OPTION = "controlroom_write"
"""Execution option set on the connections of ``begin_write``."""


@contextmanager
def begin_write(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A write transaction: committed on success, rolled back on an exception.

    The provider decides how it begins (SQLite: ``BEGIN IMMEDIATE``; elsewhere a plain
    transaction).
    """
    with engine.connect().execution_options(**{WRITE_OPTION: True}) as conn, conn.begin():
        yield conn
