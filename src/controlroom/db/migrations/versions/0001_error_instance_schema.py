"""error instance schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 18:42:59.197888
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import Dialect, migrating, unsupported

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    dialect = migrating(revision)
    op.create_table(
        "failed_error_imports",
        sa.Column("id", sa.String(length=36), nullable=False, comment="hash of headers + body"),
        sa.Column("queue", sa.String(length=400), nullable=False),
        sa.Column("headers_json", sa.Text(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("failed_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_failed_error_imports")),
    )
    op.create_table(
        "failed_messages",
        sa.Column("id", sa.String(length=36), nullable=False, comment="UniqueMessageId"),
        sa.Column("message_id", sa.String(length=400), nullable=False),
        sa.Column("status", sa.SmallInteger(), nullable=False),
        sa.Column("status_changed_at", sa.DateTime(), nullable=False),
        sa.Column("last_modified", sa.DateTime(), nullable=False),
        sa.Column("number_of_processing_attempts", sa.Integer(), nullable=False),
        sa.Column("first_failure_at", sa.DateTime(), nullable=False),
        sa.Column(
            "last_failure_at",
            sa.DateTime(),
            nullable=False,
            comment="the stored attempt's",
        ),
        sa.Column("message_type", sa.Text(), nullable=True),
        sa.Column("time_sent", sa.DateTime(), nullable=True),
        sa.Column("is_system_message", sa.Boolean(), nullable=False),
        sa.Column("conversation_id", sa.String(length=400), nullable=True),
        sa.Column("exception_type", sa.Text(), nullable=True),
        sa.Column("exception_message", sa.Text(), nullable=True),
        sa.Column("exception_source", sa.Text(), nullable=True),
        sa.Column("stack_trace", sa.Text(), nullable=True),
        sa.Column(
            "queue_address", sa.String(length=400), nullable=False, comment="NServiceBus.FailedQ"
        ),
        sa.Column("receiving_endpoint", sa.String(length=400), nullable=False),
        sa.Column("receiving_host_id", sa.String(length=100), nullable=True),
        sa.Column("receiving_host", sa.String(length=400), nullable=True),
        sa.Column("sending_endpoint", sa.String(length=400), nullable=True),
        sa.Column("sending_host_id", sa.String(length=100), nullable=True),
        sa.Column("sending_host", sa.String(length=400), nullable=True),
        sa.Column("headers_json", sa.Text(), nullable=False),
        sa.Column("content_type", sa.String(length=400), nullable=False),
        sa.Column("body_size", sa.BigInteger(), nullable=False, comment="true size, bytes"),
        sa.Column(
            "body_text", sa.Text(), nullable=True, comment="inline text, or the searchable prefix"
        ),
        sa.Column("body_stored_externally", sa.Boolean(), nullable=False),
        sa.Column(
            "body_key", sa.String(length=200), nullable=True, comment="key in the body store"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_failed_messages")),
    )
    with op.batch_alter_table("failed_messages", schema=None) as batch_op:
        batch_op.create_index(
            "ix_failed_messages_last_failure_at", ["last_failure_at"], unique=False
        )
        batch_op.create_index("ix_failed_messages_message_id", ["message_id"], unique=False)
        batch_op.create_index("ix_failed_messages_queue_address", ["queue_address"], unique=False)
        batch_op.create_index(
            "ix_failed_messages_receiving_endpoint", ["receiving_endpoint"], unique=False
        )
        batch_op.create_index(
            "ix_failed_messages_retention",
            ["status_changed_at"],
            unique=False,
            sqlite_where=sa.text("status IN (2, 4)"),
            postgresql_where=sa.text("status IN (2, 4)"),
        )
        batch_op.create_index(
            "ix_failed_messages_status_last_modified", ["status", "last_modified"], unique=False
        )
        batch_op.create_index("ix_failed_messages_time_sent", ["time_sent"], unique=False)

    op.create_table(
        "known_endpoints",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=400), nullable=False),
        sa.Column("host_id", sa.String(length=100), nullable=False),
        sa.Column("host", sa.String(length=400), nullable=True),
        sa.Column("monitored", sa.Boolean(), nullable=False, comment="the user's choice"),
        sa.Column("first_seen_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_known_endpoints")),
    )
    op.create_table(
        "retry_batches",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("request_id", sa.String(length=400), nullable=False),
        sa.Column("retry_type", sa.String(length=50), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("originator", sa.Text(), nullable=True),
        sa.Column("classifier", sa.String(length=100), nullable=True),
        sa.Column("initial_batch_size", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("last_modified", sa.DateTime(), nullable=False),
        sa.Column("completed_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_retry_batches")),
    )
    with op.batch_alter_table("retry_batches", schema=None) as batch_op:
        batch_op.create_index("ix_retry_batches_status", ["status"], unique=False)

    op.create_table(
        "failed_message_groups",
        sa.Column("failed_message_id", sa.String(length=36), nullable=False),
        sa.Column("group_id", sa.String(length=36), nullable=False),
        sa.Column("classifier", sa.String(length=100), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["failed_message_id"],
            ["failed_messages.id"],
            name=op.f("fk_failed_message_groups_failed_message_id_failed_messages"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "failed_message_id", "group_id", name=op.f("pk_failed_message_groups")
        ),
    )
    with op.batch_alter_table("failed_message_groups", schema=None) as batch_op:
        batch_op.create_index("ix_failed_message_groups_group_id", ["group_id"], unique=False)

    op.create_table(
        "failed_message_retries",
        sa.Column("failed_message_id", sa.String(length=36), nullable=False),
        sa.Column("retry_batch_id", sa.String(length=36), nullable=False),
        sa.Column("stage_attempts", sa.Integer(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(
            ["retry_batch_id"],
            ["retry_batches.id"],
            name=op.f("fk_failed_message_retries_retry_batch_id_retry_batches"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("failed_message_id", name=op.f("pk_failed_message_retries")),
    )
    with op.batch_alter_table("failed_message_retries", schema=None) as batch_op:
        batch_op.create_index(
            "ix_failed_message_retries_retry_batch_id", ["retry_batch_id"], unique=False
        )

    create_full_text_search(dialect)


def downgrade() -> None:
    drop_full_text_search(migrating(revision))
    with op.batch_alter_table("failed_message_retries", schema=None) as batch_op:
        batch_op.drop_index("ix_failed_message_retries_retry_batch_id")

    op.drop_table("failed_message_retries")
    with op.batch_alter_table("failed_message_groups", schema=None) as batch_op:
        batch_op.drop_index("ix_failed_message_groups_group_id")

    op.drop_table("failed_message_groups")
    with op.batch_alter_table("retry_batches", schema=None) as batch_op:
        batch_op.drop_index("ix_retry_batches_status")

    op.drop_table("retry_batches")
    op.drop_table("known_endpoints")
    with op.batch_alter_table("failed_messages", schema=None) as batch_op:
        batch_op.drop_index("ix_failed_messages_time_sent")
        batch_op.drop_index("ix_failed_messages_status_last_modified")
        batch_op.drop_index(
            "ix_failed_messages_retention",
            sqlite_where=sa.text("status IN (2, 4)"),
            postgresql_where=sa.text("status IN (2, 4)"),
        )
        batch_op.drop_index("ix_failed_messages_receiving_endpoint")
        batch_op.drop_index("ix_failed_messages_queue_address")
        batch_op.drop_index("ix_failed_messages_message_id")
        batch_op.drop_index("ix_failed_messages_last_failure_at")

    op.drop_table("failed_messages")
    op.drop_table("failed_error_imports")


# Search covers the first SEARCH_PREFIX_CHARS characters of the headers and of the body
# text: a PostgreSQL tsvector is limited to 1 MB, and the stored data stays whole anyway.
SEARCH_PREFIX_CHARS = 100_000

# Each text is indexed twice: as written (so "System.InvalidOperationException" is one
# term) and split at punctuation (so "InvalidOperationException" is a term too).
_PG_SEARCH_SOURCE = (
    f"left(coalesce(headers_json, ''), {SEARCH_PREFIX_CHARS}) || ' ' || "
    f"left(coalesce(body_text, ''), {SEARCH_PREFIX_CHARS})"
)
_PG_SEARCH_VECTOR = (
    f"to_tsvector('simple'::regconfig, {_PG_SEARCH_SOURCE}) || "
    f"to_tsvector('simple'::regconfig, "
    f"regexp_replace({_PG_SEARCH_SOURCE}, '[^[:alnum:]]+', ' ', 'g'))"
)

_SQLITE_FTS_COLUMNS = "headers_json, body_text"
_SQLITE_FTS_NEW = "new.rowid, new.headers_json, new.body_text"
_SQLITE_FTS_OLD = "'delete', old.rowid, old.headers_json, old.body_text"


def create_full_text_search(dialect: Dialect) -> None:
    """Provider-native full-text search over headers and body text (docs/design.md "Search")."""
    if dialect == "postgresql":
        op.execute(
            "ALTER TABLE failed_messages ADD COLUMN search_vector tsvector "
            f"GENERATED ALWAYS AS ({_PG_SEARCH_VECTOR}) STORED"
        )
        op.execute(
            "CREATE INDEX ix_failed_messages_search_vector "
            "ON failed_messages USING gin (search_vector)"
        )
    elif dialect == "sqlite":
        # External-content FTS5: the text lives once, in failed_messages; triggers keep
        # the index in step with inserts, upserts and deletes.
        op.execute(
            f"CREATE VIRTUAL TABLE failed_messages_fts USING fts5({_SQLITE_FTS_COLUMNS}, "
            "content='failed_messages', content_rowid='rowid', tokenize='unicode61')"
        )
        op.execute(
            "CREATE TRIGGER failed_messages_fts_insert AFTER INSERT ON failed_messages BEGIN "
            f"INSERT INTO failed_messages_fts(rowid, {_SQLITE_FTS_COLUMNS}) "
            f"VALUES ({_SQLITE_FTS_NEW}); END"
        )
        op.execute(
            "CREATE TRIGGER failed_messages_fts_delete AFTER DELETE ON failed_messages BEGIN "
            f"INSERT INTO failed_messages_fts(failed_messages_fts, rowid, {_SQLITE_FTS_COLUMNS}) "
            f"VALUES ({_SQLITE_FTS_OLD}); END"
        )
        op.execute(
            "CREATE TRIGGER failed_messages_fts_update AFTER UPDATE OF headers_json, body_text "
            "ON failed_messages BEGIN "
            f"INSERT INTO failed_messages_fts(failed_messages_fts, rowid, {_SQLITE_FTS_COLUMNS}) "
            f"VALUES ({_SQLITE_FTS_OLD}); "
            f"INSERT INTO failed_messages_fts(rowid, {_SQLITE_FTS_COLUMNS}) "
            f"VALUES ({_SQLITE_FTS_NEW}); END"
        )
    else:
        unsupported(dialect, revision)


def drop_full_text_search(dialect: Dialect) -> None:
    if dialect == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_failed_messages_search_vector")
        op.execute("ALTER TABLE failed_messages DROP COLUMN IF EXISTS search_vector")
    elif dialect == "sqlite":
        for trigger in ("insert", "delete", "update"):
            op.execute(f"DROP TRIGGER IF EXISTS failed_messages_fts_{trigger}")
        op.execute("DROP TABLE IF EXISTS failed_messages_fts")
    else:
        unsupported(dialect, revision)
