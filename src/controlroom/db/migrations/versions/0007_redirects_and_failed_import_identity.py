"""message redirects; failed-import identity; indexes of ServiceControl's filters

Revision ID: 0007
Revises: 0004
Create Date: 2026-12-01 13:50:00.000000

- ``message_redirects``: ServiceControl's redirects (``/api/redirects``): retries of
  messages that failed in ``from_physical_address`` go to ``to_physical_address``. The id
  is ServiceControl's, the deterministic id of the from-address, so one redirect per
  address.
- ``failed_error_imports`` ids become the failed import's identity (docs/decisions.md
  "Failed imports have an identity"): the
  deterministic id of message id + endpoint when the message names them, else the content
  hash as before (``errors.ingest.identity.failed_import_id`` as it was: the migration
  keeps its own copy, ``_failed_import_id``). Existing rows are re-keyed; of rows that now
  share an id the latest failure is kept.
- ``lower(queue_address)``: the list's queue-address filter matches in any case.
- ``conversation_id``: ``/api/conversations/{id}``.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

import sqlalchemy as sa
from alembic import op

from controlroom.db.migrations._dialects import migrating

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_IMPORTS = sa.table(
    "failed_error_imports",
    sa.column("id", sa.String),
    sa.column("headers_json", sa.Text),
    sa.column("body", sa.LargeBinary),
    sa.column("failed_at", sa.DateTime()),
)


def upgrade() -> None:
    migrating(revision)
    op.create_table(
        "message_redirects",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("from_physical_address", sa.String(length=400), nullable=False),
        sa.Column("to_physical_address", sa.String(length=400), nullable=False),
        sa.Column("last_modified", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_message_redirects")),
        sa.UniqueConstraint(
            "from_physical_address", name=op.f("uq_message_redirects_from_physical_address")
        ),
    )
    op.create_index(
        "ix_failed_messages_queue_address_lower",
        "failed_messages",
        [sa.text("lower(queue_address)")],
    )
    op.create_index("ix_failed_messages_conversation_id", "failed_messages", ["conversation_id"])
    _rekey_failed_imports()


def _rekey_failed_imports() -> None:
    """Give every failed import its identity id; of rows sharing one, keep the latest."""
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(_IMPORTS.c.id, _IMPORTS.c.headers_json, _IMPORTS.c.body, _IMPORTS.c.failed_at)
    ).all()
    keep: dict[str, tuple[str, object]] = {}  # new id -> (old id, failed_at)
    renames: dict[str, str] = {}
    for row in rows:
        headers = json.loads(row.headers_json)
        new_id = _failed_import_id(headers, row.headers_json, bytes(row.body))
        renames[row.id] = new_id
        kept = keep.get(new_id)
        if kept is None or (row.failed_at, row.id) > (kept[1], kept[0]):
            keep[new_id] = (row.id, row.failed_at)
    survivors = {old for old, _ in keep.values()}
    for old_id in renames:
        if old_id not in survivors:
            conn.execute(sa.delete(_IMPORTS).where(_IMPORTS.c.id == old_id))
    # Two passes through temporary ids, so a new id never meets an old one still in place.
    for old_id, new_id in renames.items():
        if old_id in survivors and old_id != new_id:
            conn.execute(
                sa.update(_IMPORTS).where(_IMPORTS.c.id == old_id).values(id=f"~{new_id[1:]}")
            )
    for old_id, new_id in renames.items():
        if old_id in survivors and old_id != new_id:
            conn.execute(
                sa.update(_IMPORTS).where(_IMPORTS.c.id == f"~{new_id[1:]}").values(id=new_id)
            )


def downgrade() -> None:
    migrating(revision)
    # Failed-import ids stay as they are: any id is a valid key for the old code.
    op.drop_index("ix_failed_messages_conversation_id", table_name="failed_messages")
    op.drop_index("ix_failed_messages_queue_address_lower", table_name="failed_messages")
    op.drop_table("message_redirects")


# The identity of a failed import as this migration defined it, frozen here: the live
# code (errors.ingest.identity, errors.ingest.headers) may change, this must not.
def _failed_import_id(headers: dict[str, Any], headers_json: str, body: bytes) -> str:
    """``_deterministic_id(message id + processing endpoint)`` when the headers name a
    ``NServiceBus.MessageId``, else the SHA-256 of ``headers_json``, NUL and ``body`` read
    as a UUID (its first 16 bytes)."""
    message_id = _header_text(headers, "NServiceBus.MessageId")
    if message_id is not None:
        return _deterministic_id(message_id + (_processing_endpoint(headers) or ""))
    digest = hashlib.sha256(headers_json.encode() + b"\0" + body).digest()
    return str(uuid.UUID(bytes=digest[:16]))


def _deterministic_id(text: str) -> str:
    """ServiceControl's ``DeterministicGuid.MakeId``: the MD5 of the UTF-8 text (a lone
    surrogate as its code unit) as a .NET ``Guid``, lower-case "D" form."""
    data = text.encode("utf-8", "surrogatepass")
    return str(uuid.UUID(bytes_le=hashlib.md5(data, usedforsecurity=False).digest()))


def _header_text(headers: dict[str, Any], name: str) -> str | None:
    """The header's value, ``None`` when absent, null, empty or blank."""
    value = headers.get(name)
    if value is None or not value.strip():
        return None
    return str(value)


def _processing_endpoint(headers: dict[str, Any]) -> str | None:
    """``NServiceBus.ProcessingEndpoint``, else the queue (before the first ``@``) of
    ``NServiceBus.FailedQ``, else of ``NServiceBus.ReplyToAddress``; ``None`` when none."""
    endpoint = _header_text(headers, "NServiceBus.ProcessingEndpoint")
    if endpoint is not None:
        return endpoint
    for name in ("NServiceBus.FailedQ", "NServiceBus.ReplyToAddress"):
        address = _header_text(headers, name)
        if address is not None and address.partition("@")[0]:
            return address.partition("@")[0]
    return None
