"""write path v2: counted failure times, search terms written by the process

Revision ID: 0009
Revises: 0004
Create Date: 2026-12-01 13:50:00.000000

- ``failed_messages.counted_failure_times``: the distinct times of failure a row has
  counted, newest first, bounded (``errors.ingest.upsert``), so a redelivered attempt is
  never counted twice. Rows stored before keep an empty list: their earlier attempts
  cannot be told from new ones, so for those the seed's rule applies (add unless the
  batch's last attempt equals the stored one), as it did. A column with a constant
  default is a change of the catalogue only, on both providers: no row is rewritten.
- ``failed_messages.search_vector`` holds the search terms the process computes
  (``errors.ingest.search_terms``) instead of text the server tokenizes: on PostgreSQL
  an ordinary ``tsvector`` replaces the generated one (its GIN index kept, ``fastupdate``
  on); on SQLite the terms' text, indexed by a new FTS5 table whose tokenizer keeps each
  term whole, with triggers that fire only when the terms change.

Rows stored before have no terms yet (``search_vector`` NULL, found through the partial
index ``ix_failed_messages_search_pending``). This migration does not compute them: a
million rows in its one transaction would hold the table's lock for minutes.
``errors.ingest.search_backfill`` writes them afterwards in short transactions of a
batch each (``controlroom migrate`` shows a progress bar; ``serve`` does it before it
ingests).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0009"
down_revision = "0007"
branch_labels = None
depends_on = None

TABLE = "failed_messages"
PENDING_INDEX = "ix_failed_messages_search_pending"

_SQLITE_FTS_TRIGGERS = ("insert", "delete", "update")
# Every character of a term is a token character, so the terms the process wrote, space
# separated, are indexed whole (the SQLite provider's FTS_TOKENIZER when this was written).
_SQLITE_FTS_TOKENIZER = "unicode61 remove_diacritics 0 categories 'L* M* N* P* S* Co'"


def upgrade() -> None:
    dialect = migrating(revision)
    counted: sa.Column[object]
    if dialect == "postgresql":
        counted = sa.Column(
            "counted_failure_times",
            ARRAY(sa.BigInteger),
            nullable=False,
            server_default=sa.text("'{}'::bigint[]"),
        )
    elif dialect == "sqlite":
        counted = sa.Column(
            "counted_failure_times", sa.JSON, nullable=False, server_default=sa.text("'[]'")
        )
    else:
        unsupported(dialect, revision)
    op.add_column(TABLE, counted)

    if dialect == "postgresql":
        # Dropping the generated column drops its GIN index; neither rewrites a row.
        op.execute("ALTER TABLE failed_messages DROP COLUMN search_vector")
        op.execute("ALTER TABLE failed_messages ADD COLUMN search_vector tsvector")
        op.execute(
            "CREATE INDEX ix_failed_messages_search_vector ON failed_messages "
            "USING gin (search_vector) WITH (fastupdate = on)"
        )
    elif dialect == "sqlite":
        _drop_sqlite_fts()
        op.add_column(TABLE, sa.Column("search_vector", sa.Text, nullable=True))
        _create_sqlite_fts(
            columns="search_vector",
            tokenizer=_SQLITE_FTS_TOKENIZER,
            update_of="search_vector",
            changed="old.search_vector IS NOT new.search_vector",
        )
    else:
        unsupported(dialect, revision)
    op.create_index(
        PENDING_INDEX,
        TABLE,
        ["id"],
        sqlite_where=sa.text("search_vector IS NULL"),
        postgresql_where=sa.text("search_vector IS NULL"),
    )


def downgrade() -> None:
    dialect = migrating(revision)
    op.drop_index(PENDING_INDEX, table_name=TABLE)
    if dialect == "postgresql":
        op.execute("ALTER TABLE failed_messages DROP COLUMN search_vector")
        op.execute(f"ALTER TABLE failed_messages ADD COLUMN search_vector tsvector {_PG_0001}")
        op.execute(
            "CREATE INDEX ix_failed_messages_search_vector "
            "ON failed_messages USING gin (search_vector)"
        )
        op.drop_column(TABLE, "counted_failure_times")
    elif dialect == "sqlite":
        _drop_sqlite_fts()
        with op.batch_alter_table(TABLE) as batch_op:
            batch_op.drop_column("search_vector")
            batch_op.drop_column("counted_failure_times")
        _create_sqlite_fts(
            columns="headers_json, body_text",
            tokenizer="unicode61",
            update_of="headers_json, body_text",
            changed=None,
        )
        op.execute("INSERT INTO failed_messages_fts(failed_messages_fts) VALUES ('rebuild')")
    else:
        unsupported(dialect, revision)


def _drop_sqlite_fts() -> None:
    for trigger in _SQLITE_FTS_TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS failed_messages_fts_{trigger}")
    op.execute("DROP TABLE IF EXISTS failed_messages_fts")


def _create_sqlite_fts(
    *, columns: str, tokenizer: str, update_of: str, changed: str | None
) -> None:
    """The external-content FTS5 table over ``columns`` of failed_messages, and the
    triggers that keep it in step (the update trigger only ``WHEN changed``).

    FTS5 must be told to delete exactly what it indexed (a 'delete' of a row it never
    indexed corrupts it), and rows without terms (stored before this migration, until
    the backfill) are never indexed: each statement of a trigger skips a row whose
    indexed text is NULL.
    """
    names = [name.strip() for name in columns.split(",")]
    new = ", ".join(f"new.{name}" for name in names)
    old = ", ".join(f"old.{name}" for name in names)
    new_has_text = " OR ".join(f"new.{name} IS NOT NULL" for name in names)
    old_has_text = " OR ".join(f"old.{name} IS NOT NULL" for name in names)
    insert_new = (
        f"INSERT INTO failed_messages_fts(rowid, {columns}) "
        f"SELECT new.rowid, {new} WHERE {new_has_text};"
    )
    delete_old = (
        f"INSERT INTO failed_messages_fts(failed_messages_fts, rowid, {columns}) "
        f"SELECT 'delete', old.rowid, {old} WHERE {old_has_text};"
    )
    quoted = tokenizer.replace("'", "''")
    op.execute(
        f"CREATE VIRTUAL TABLE failed_messages_fts USING fts5({columns}, "
        f"content='failed_messages', content_rowid='rowid', tokenize='{quoted}')"
    )
    op.execute(
        "CREATE TRIGGER failed_messages_fts_insert AFTER INSERT ON failed_messages "
        f"BEGIN {insert_new} END"
    )
    op.execute(
        "CREATE TRIGGER failed_messages_fts_delete AFTER DELETE ON failed_messages "
        f"BEGIN {delete_old} END"
    )
    when = f"WHEN {changed} " if changed else ""
    op.execute(
        f"CREATE TRIGGER failed_messages_fts_update AFTER UPDATE OF {update_of} "
        f"ON failed_messages {when}BEGIN {delete_old} {insert_new} END"
    )


# Migration 0001's generated search_vector, restored by the downgrade.
_PG_0001_SOURCE = (
    "left(coalesce(headers_json, ''), 100000) || ' ' || left(coalesce(body_text, ''), 100000)"
)
_PG_0001 = (
    f"GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, {_PG_0001_SOURCE}) || "
    f"to_tsvector('simple'::regconfig, "
    f"regexp_replace({_PG_0001_SOURCE}, '[^[:alnum:]]+', ' ', 'g'))) STORED"
)
