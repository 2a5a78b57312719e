"""tally key digest: any key the write path accepts can be folded (PostgreSQL)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 23:00:00.000000

Source: docs/decisions.md "Tally keys are indexed by a digest". Migration 0012's unique index held
the tallies' whole key. A failed message whose receiving endpoint (400 characters), host id (100),
host (400) and message type are each within their column can together exceed a btree index row
(2,704 bytes on PostgreSQL; 4 bytes a character in UTF-8): the fold of the deltas then failed on
every attempt, so the counts stayed exact but the delta and group-count rows grew forever.

On PostgreSQL the unique index gives way to a plain index over the status, the system
flag and the ``md5`` of the text columns (``KEY_DIGEST``: 32 characters whatever the
key's length). ``Provider.compact_tallies`` finds a key's tally by the digest and compares
the full columns, so two keys of one digest stay two rows. A key has one tally row
because its only writer after this migration is that fold, under its advisory lock, which
adds to a key's row when one exists and inserts one otherwise; a reader sums per key
anyway (``errors.tallies.tally_rows``). The stored rows need no change: 0012's unique index
kept one row per key, and no key too long for it ever reached the tallies (those waited
in the deltas, which the next fold now takes).

SQLite keeps 0012's unique index: an SQLite index record has no such limit (a long one
spills to overflow pages), and its row triggers upsert on that index.

Downgrade: every tally row moves to the deltas (a key's count is its tally plus its
deltas, so every count is unchanged) and 0012's unique index comes back over the then
empty tallies; a long key's fold fails again, as before this migration.
"""

from __future__ import annotations

from alembic import op

from controlroom.db.migrations._dialects import migrating, unsupported

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

TALLIES = "failed_message_tallies"
DELTAS = "failed_message_tally_deltas"
OLD_INDEX = "ux_failed_message_tallies_key"
INDEX = "ix_failed_message_tallies_key_digest"
_COLUMNS = (
    "status, is_system_message, receiving_endpoint, receiving_host_id, receiving_host, message_type"
)
# The same text as the provider's (db/providers/postgresql.py), so its fold's lookup
# matches this index's expression. Not injective (NULL and '' hash alike): the full
# columns decide.
KEY_DIGEST = (
    "md5(receiving_endpoint || '|' || coalesce(receiving_host_id, '') || '|' "
    "|| coalesce(receiving_host, '') || '|' || coalesce(message_type, ''))"
)
# 0012's unique key.
_OLD_KEY = (
    "status, is_system_message, receiving_endpoint, "
    "coalesce(receiving_host_id, ''), (receiving_host_id IS NULL), "
    "coalesce(receiving_host, ''), (receiving_host IS NULL), "
    "coalesce(message_type, ''), (message_type IS NULL)"
)


def upgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        op.execute(f"DROP INDEX {OLD_INDEX}")
        op.execute(f"CREATE INDEX {INDEX} ON {TALLIES} (status, is_system_message, {KEY_DIGEST})")
    elif dialect == "sqlite":
        pass  # SQLite's unique index of 0012 holds a key of any length
    else:
        unsupported(dialect, revision)


def downgrade() -> None:
    dialect = migrating(revision)
    if dialect == "postgresql":
        op.execute(f"DROP INDEX {INDEX}")
        op.execute(
            f"INSERT INTO {DELTAS} ({_COLUMNS}, messages) "
            f"SELECT {_COLUMNS}, messages FROM {TALLIES}"
        )
        # TRUNCATE, not DELETE: an index built in the transaction that deleted rows still
        # indexes them (others may see them), and a long key's row would not fit.
        op.execute(f"TRUNCATE {TALLIES}")
        op.execute(f"CREATE UNIQUE INDEX {OLD_INDEX} ON {TALLIES} ({_OLD_KEY})")
    elif dialect == "sqlite":
        pass
    else:
        unsupported(dialect, revision)
