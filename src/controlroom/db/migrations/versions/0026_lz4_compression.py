"""lz4 compression: the failed messages' large columns are compressed by lz4, not pglz

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-04 12:00:00.000000

Source: docs/decisions.md "The failed messages' large columns are compressed by lz4"
(figures in ``benchmarks/README.md``). PostgreSQL compresses a value over about 2 KB
before it stores it (TOAST); its default, ``pglz``, was 28 % of a COPY backend's CPU on
the write path's rows (``headers_json`` and ``search_vector``), where ``lz4`` costs a
fraction of it and decompresses faster.

PostgreSQL 14 or later built with lz4 (``lz4`` among ``default_toast_compression``'s
values): ``ALTER COLUMN ... SET COMPRESSION lz4`` on ``failed_messages.headers_json``,
``body_text`` and ``search_vector``; values stored before stay as they are (a column's
compression applies to the values written after it), both kinds read alike. A server
without lz4 keeps its default. Down: ``SET COMPRESSION default``.

SQLite compresses nothing: nothing to do.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

COLUMNS = ("headers_json", "body_text", "search_vector")
"""The columns of ``failed_messages`` compressed by lz4."""


def lz4_available(connection: sa.Connection) -> bool:
    """Whether the server can compress a column by lz4 (PostgreSQL 14+, built with it)."""
    values = connection.execute(
        sa.text("SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'")
    ).scalar()
    return values is not None and "lz4" in values


def _set_compression(method: str) -> None:
    clauses = ", ".join(f"ALTER COLUMN {column} SET COMPRESSION {method}" for column in COLUMNS)
    op.execute(f"ALTER TABLE failed_messages {clauses}")


def upgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        if lz4_available(op.get_bind()):
            _set_compression("lz4")
    elif dialect == "sqlite":
        pass
    else:
        unsupported(dialect, revision)


def downgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        if lz4_available(op.get_bind()):
            _set_compression("default")
    elif dialect == "sqlite":
        pass
    else:
        unsupported(dialect, revision)
