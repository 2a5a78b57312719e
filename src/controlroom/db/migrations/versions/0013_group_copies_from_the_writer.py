"""group copies from the writer: the insert trigger only fills rows inserted without them

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 20:00:00.000000

Source: docs/decisions.md "The read side may cost the write path at most a tenth". Migration 0011's
insert trigger looked a group row's message up once per row (a ``plpgsql`` call and a primary-key
probe on PostgreSQL, an ``UPDATE`` of the row just inserted on SQLite), five rows per message. The
writer now inserts its group rows with the copies, read from the message in the same statement
(``INSERT ... SELECT`` joining ``failed_messages``, ``errors.ingest.writer``); the trigger gets a
``WHEN`` so the database skips it for those rows without calling it, and still fills any row
inserted without a copy (any other inserter). The update trigger of 0011 is unchanged: its ``WHEN``
already compares the old and new values before calling the function.

Nothing to fill: every existing copy is already its message's value.
"""

from __future__ import annotations

from alembic import op

from controlroom.db.migrations._dialects import Dialect, migrating, unsupported

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

GROUPS = "failed_message_groups"
TRIGGER = "failed_message_groups_copy_message"
COPIED = ("status", "first_failure_at", "last_failure_at")
_COLUMNS = ", ".join(COPIED)
# A row inserted without any one copy takes all three from its message.
_MISSING = " OR ".join(f"new.{c} IS NULL" for c in COPIED)
_FROM_MESSAGE = (
    "(SELECT m.status, m.first_failure_at, m.last_failure_at "
    "FROM failed_messages m WHERE m.id = new.failed_message_id)"
)


def upgrade() -> None:
    _replace_insert_trigger(migrating(revision), when=f"({_MISSING})")


def downgrade() -> None:
    _replace_insert_trigger(migrating(revision), when=None)


def _replace_insert_trigger(dialect: Dialect, when: str | None) -> None:
    """The insert trigger of 0011, invoked only ``when`` (always without one)."""
    if dialect == "postgresql":
        op.execute(f"DROP TRIGGER {TRIGGER} ON {GROUPS}")
        op.execute(
            f"CREATE TRIGGER {TRIGGER} BEFORE INSERT ON {GROUPS} FOR EACH ROW "
            + (f"WHEN {when} " if when else "")
            + f"EXECUTE FUNCTION {TRIGGER}()"
        )
    elif dialect == "sqlite":
        op.execute(f"DROP TRIGGER {TRIGGER}")
        op.execute(
            f"CREATE TRIGGER {TRIGGER} AFTER INSERT ON {GROUPS} "
            + (f"WHEN {when} " if when else "")
            + f"BEGIN UPDATE {GROUPS} SET ({_COLUMNS}) = {_FROM_MESSAGE} "
            "WHERE rowid = new.rowid; END"
        )
    else:
        unsupported(dialect, revision)
