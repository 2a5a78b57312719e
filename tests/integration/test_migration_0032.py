"""Migration 0032 on each provider: an endpoint's and a queue address's pages by message
type walk ``(subset column, message_type, id)`` for the types of at most
``INDEXED_TYPE_BYTES`` and merge in the longer ones, in the order the store sorts them
(empty types first ascending, bytes, not characters, deciding which walk a type is in);
a message whose endpoint name and type are as long as they may be is stored; a downgrade
takes the indexes back."""

from __future__ import annotations

import dataclasses
import random
import string
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.read.filters import FailedMessageFilter, Ordering
from controlroom.errors.read.lists import INDEXED_TYPE_BYTES, list_failed_messages
from tests.factories import at, attempt
from tests.subset_pages import indexes

SHORT = "ix_failed_messages_receiving_endpoint_message_type"
INDEXES = {
    SHORT,
    "ix_failed_messages_queue_address_lower_message_type",
    "ix_failed_messages_receiving_endpoint_long_type",
    "ix_failed_messages_queue_address_lower_long_type",
}
TYPES = [
    None,
    "Alpha",
    "M" * (INDEXED_TYPE_BYTES + 200),  # longer: between the short ones in the order
    "é" * (INDEXED_TYPE_BYTES // 2 + 1),  # fewer characters than the bound, more bytes
    "N" * INDEXED_TYPE_BYTES,  # at the bound: indexed
    "Type1",
    "Type2",
]
SUBSETS = {
    "endpoint": (FailedMessageFilter(receiving_endpoint="queue"), "receiving_endpoint = 'queue'"),
    "unresolved of an endpoint": (
        FailedMessageFilter(
            receiving_endpoint="queue", statuses=frozenset({FailedMessageStatus.UNRESOLVED})
        ),
        "receiving_endpoint = 'queue' AND status = 1",
    ),
    "queue address": (FailedMessageFilter(queue_address="QUEUE"), "lower(queue_address) = 'queue'"),
}


def listed(engine: sa.Engine, where: FailedMessageFilter, descending: bool) -> list[str]:
    """The ids of ``where`` by message type, read page by page (4 a page)."""
    ids: list[str] = []
    with engine.connect() as conn:
        while True:
            page = list_failed_messages(
                conn,
                offset=len(ids),
                limit=4,
                where=where,
                order=Ordering("message_type", descending),
            )
            ids += [item.id for item in page.items]
            if len(page.items) < 4:
                return ids


def sorted_by_store(engine: sa.Engine, condition: str, descending: bool) -> list[str]:
    """The ids meeting ``condition`` as the store sorts them by message type (empty types
    first ascending), then time of failure and id (migration 0036)."""
    direction = "DESC NULLS LAST" if descending else "ASC NULLS FIRST"
    ties = "DESC" if descending else "ASC"
    with engine.connect() as conn:
        return list(
            conn.exec_driver_sql(
                f"SELECT id FROM failed_messages WHERE {condition} "
                f"ORDER BY message_type {direction}, last_failure_at {ties}, id {ties}"
            ).scalars()
        )


def test_0032_pages_by_message_type_walk_the_subsets_rows_in_the_stores_order(
    engine: sa.Engine,
) -> None:
    writer = FailedMessageBatchWriter(engine, clock=lambda: datetime(2026, 1, 2, tzinfo=UTC))
    writer.write(
        IngestionBatch(
            attempts=[
                dataclasses.replace(
                    # failing out of the ids' order: the time of failure orders equal types
                    attempt(n, at(10 * ((n * 13) % 40)), endpoint="queue" if n % 5 else "Other"),
                    message_type=TYPES[n % len(TYPES)],
                )
                for n in range(40)
            ]
        )
    )
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE failed_messages SET status = :s WHERE message_id LIKE '%3'"),
            {"s": int(FailedMessageStatus.RESOLVED)},
        )
    assert set(indexes(engine)) >= INDEXES
    expected = {
        (name, descending): sorted_by_store(engine, condition, descending)
        for name, (_, condition) in SUBSETS.items()
        for descending in (True, False)
    }
    assert all(len(ids) > 20 for ids in expected.values())

    def answers() -> dict[tuple[str, bool], list[str]]:
        return {
            (name, descending): listed(engine, where, descending)
            for name, (where, _) in SUBSETS.items()
            for descending in (True, False)
        }

    assert answers() == expected
    command.downgrade(alembic_config(engine), "0031")
    assert not INDEXES & set(indexes(engine))
    assert answers() == expected
    upgrade_database(engine)
    assert set(indexes(engine)) >= INDEXES
    assert answers() == expected


def test_an_endpoints_page_by_message_type_walks_its_index(engine: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(engine, clock=lambda: datetime(2026, 1, 2, tzinfo=UTC))
    writer.write(IngestionBatch(attempts=[attempt(n, at(n), endpoint="queue") for n in range(5)]))
    statements: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        statements.append((statement, parameters))

    with engine.connect() as conn:
        sa.event.listen(conn, "before_cursor_execute", record)
        list_failed_messages(
            conn,
            offset=0,
            limit=50,
            where=FailedMessageFilter(receiving_endpoint="queue"),
            order=Ordering("message_type"),
        )
        sa.event.remove(conn, "before_cursor_execute", record)
        pages = [(s, p) for s, p in statements if "message_type" in s and "LIMIT" in s.upper()]
        assert pages, statements
        explain = "EXPLAIN" if engine.dialect.name == "postgresql" else "EXPLAIN QUERY PLAN"
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SET enable_seqscan = off")  # five rows: as a large table
        plan = "\n".join(
            str(row[-1])
            for row in conn.exec_driver_sql(f"{explain} {pages[0][0]}", pages[0][1])  # type: ignore[arg-type]
        )
    assert SHORT in plan, plan


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_the_longest_endpoint_name_beside_a_type_at_the_bound_is_stored(
    engine: sa.Engine,
) -> None:
    """An endpoint name of 400 four-byte characters (its column's limit) and a message
    type of ``INDEXED_TYPE_BYTES`` letters make an entry within PostgreSQL's 2,704 bytes;
    a longer type, which would pass it, goes to the index of the long types. Random, so
    that PostgreSQL cannot compress the entry below its limit. (A queue address that long
    is refused already, docs/decisions.md "A subset is read from its own rows".)"""
    rng = random.Random(32)
    endpoint = "".join(chr(rng.randrange(0x1D400, 0x1D7FF)) for _ in range(400))
    kinds = [
        "".join(rng.choice(string.ascii_letters) for _ in range(length))
        for length in (INDEXED_TYPE_BYTES, INDEXED_TYPE_BYTES + 200)
    ]
    writer = FailedMessageBatchWriter(engine, clock=lambda: datetime(2026, 1, 2, tzinfo=UTC))
    writer.write(
        IngestionBatch(
            attempts=[
                dataclasses.replace(
                    attempt(n, at(n), endpoint=endpoint), queue_address="queue", message_type=kind
                )
                for n, kind in enumerate(kinds)
            ]
        )
    )
    ids = listed(engine, FailedMessageFilter(receiving_endpoint=endpoint), descending=False)
    assert ids == sorted_by_store(engine, "true", descending=False)
    assert len(ids) == 2
