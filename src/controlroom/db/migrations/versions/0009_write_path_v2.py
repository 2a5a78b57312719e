"""write path v2: counted failure times

Revision ID: 0009
Revises: 0004
Create Date: 2026-12-01 13:50:00.000000

``failed_messages.counted_failure_times``: the distinct times of failure a row has
counted, newest first, bounded (``errors.ingest.upsert``), so a redelivered attempt is
never counted twice. Rows stored before keep an empty list: their earlier attempts cannot
be told from new ones, so for those the seed's rule applies (add unless the batch's last
attempt equals the stored one), as it did. Adding a column with a constant default is a
change of the catalogue only, on both providers: no row is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision = "0009"
down_revision = "0004"
branch_labels = None
depends_on = None

TABLE = "failed_messages"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        column = sa.Column(
            "counted_failure_times",
            ARRAY(sa.BigInteger),
            nullable=False,
            server_default=sa.text("'{}'::bigint[]"),
        )
    else:
        column = sa.Column(
            "counted_failure_times", sa.JSON, nullable=False, server_default=sa.text("'[]'")
        )
    op.add_column(TABLE, column)


def downgrade() -> None:
    with op.batch_alter_table(TABLE) as batch_op:
        batch_op.drop_column("counted_failure_times")
