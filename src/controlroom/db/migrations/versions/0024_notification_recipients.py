"""notification outbox: a site's notification to explicit addresses

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04 11:00:00.000000

Source: docs/decisions.md "Explicit recipients of a site's notification". A site may
mail addresses it names instead of a recipient list: ``recipients`` holds them, a JSON
list (at most 50 addresses of at most 254 characters, checked before they are
stored); ``NULL`` for a notification to a recipient list or a webhook.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrating(revision)
    op.add_column(
        "notifications",
        sa.Column(
            "recipients", sa.Text(), nullable=True, comment="JSON list of explicit addresses"
        ),
    )


def downgrade() -> None:
    migrating(revision)
    op.drop_column("notifications", "recipients")
