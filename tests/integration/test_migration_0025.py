"""Migration 0025 on each provider: the sort keys' own indexes give way to indexes after
the status, a list of every status reads the same page through them, and a downgrade
gives the old indexes back."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.read.filters import SORT_KEYS, Ordering
from controlroom.errors.read.lists import list_failed_messages
from tests.factories import at, attempt

KEYS = ("time_sent", "last_failure_at", "message_type")


def index_names(engine: sa.Engine) -> set[str]:
    """The names of ``failed_messages``' indexes (from the catalog: SQLAlchemy's reflection
    skips expression indexes with a warning)."""
    if engine.dialect.name == "postgresql":
        query = "SELECT indexname FROM pg_indexes WHERE tablename = 'failed_messages'"
    else:
        query = (
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'failed_messages'"
        )
    with engine.connect() as conn:
        return {str(name) for name in conn.exec_driver_sql(query).scalars()}


def pages(engine: sa.Engine) -> dict[Ordering, list[str]]:
    """The ids of every page of 4, in every sort and direction."""
    found = {}
    with engine.connect() as conn:
        for key in SORT_KEYS:
            for descending in (True, False):
                order = Ordering(key, descending)
                ids = []
                for offset in range(0, 12, 4):
                    page = list_failed_messages(conn, offset=offset, limit=4, order=order)
                    ids += [item.id for item in page.items]
                found[order] = ids
    return found


def test_0025_replaces_the_sort_key_indexes_and_gives_them_back(engine: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(engine, clock=lambda: datetime(2026, 1, 2, tzinfo=UTC))
    writer.write(
        IngestionBatch(
            attempts=[
                dataclasses.replace(
                    attempt(n, at(10 * n)),
                    time_sent=at(10 * (n % 4)) if n % 5 else None,
                    message_type=f"Type{n % 3}" if n % 4 else None,
                )
                for n in range(10)
            ]
        )
    )
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE failed_messages SET status = :s WHERE message_id IN ('msg-1', 'msg-6')"
            ),
            {"s": int(FailedMessageStatus.RESOLVED)},
        )
        conn.execute(
            sa.text("UPDATE failed_messages SET status = :s WHERE message_id = 'msg-3'"),
            {"s": int(FailedMessageStatus.ARCHIVED)},
        )
    at_head = pages(engine)
    assert all(len(ids) == 10 and len(set(ids)) == 10 for ids in at_head.values())
    names = index_names(engine)
    assert {f"ix_failed_messages_status_{key}_id" for key in KEYS} <= names
    assert not {f"ix_failed_messages_{key}_id" for key in KEYS} & names

    command.downgrade(alembic_config(engine), "0024")
    names = index_names(engine)
    assert {f"ix_failed_messages_{key}_id" for key in KEYS} <= names
    assert not {f"ix_failed_messages_status_{key}_id" for key in KEYS} & names
    assert pages(engine) == at_head
    upgrade_database(engine)
    assert pages(engine) == at_head
