"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

## Frozen: copy any logic the migration runs into it; import no controlroom code but the
## dialect helpers (a column type of db.types becomes its plain SQLAlchemy type). A branch
## on the database names each dialect and ends in `else: unsupported(dialect, revision)`.
from controlroom.db.migrations._dialects import migrating

${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    migrating(revision)
    ${upgrades if upgrades else ""}


def downgrade() -> None:
    migrating(revision)
    ${downgrades if downgrades else ""}
