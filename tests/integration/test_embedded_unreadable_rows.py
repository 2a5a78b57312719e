"""A message of the embedded queue that cannot be read whole (its row written outside
the transport: another tool, a damaged file) is a failed import, kept with what could be
read, never a crash of the intake (breaker pass, third: the worker died on it and was
started again for ever, stopping every intake; with ``ingestion.workers = 0``, serve
itself). Per provider (README "Bad input")."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.tables import failed_error_imports, failed_messages
from controlroom.transport.embedded import UNREADABLE_STORED, EmbeddedQueue
from tests.integration.test_ingestion import count, ingest_until, publish_all
from tests.nsb import failed_headers

TIMEOUT = 30


def damage(path: Path, message_id: str, how: str) -> None:
    """Write the row of ``message_id`` as another tool might have."""
    with sqlite3.connect(path) as conn:
        (row_id,) = conn.execute(
            "SELECT id FROM queue_messages WHERE message_id = ?", (message_id,)
        ).fetchone()
        if how == "headers not json":
            conn.execute(
                "UPDATE queue_messages SET headers_json = 'not json' WHERE id = ?", (row_id,)
            )
        elif how == "headers a list":
            conn.execute("UPDATE queue_messages SET headers_json = '[]' WHERE id = ?", (row_id,))
        elif how == "properties not json":
            conn.execute(
                "UPDATE queue_messages SET properties_json = 'not json' WHERE id = ?", (row_id,)
            )
        elif how == "body missing":
            conn.execute("DELETE FROM queue_bodies WHERE id = ?", (row_id,))
        elif how == "headers not utf-8":
            conn.execute(
                "UPDATE queue_messages SET headers_json = CAST(x'7b2241223a2280ff227d' AS TEXT) "
                "WHERE id = ?",
                (row_id,),
            )
        elif how == "properties not utf-8":
            conn.execute(
                "UPDATE queue_messages SET properties_json = CAST(x'80ff' AS TEXT) WHERE id = ?",
                (row_id,),
            )
        elif how in ("headers a blob", "properties a blob"):
            column = {"headers": "headers_json", "properties": "properties_json"}[how.split()[0]]
            conn.execute(
                f"UPDATE queue_messages SET {column} = x'7b2261223a22fffe227d' WHERE id = ?",
                (row_id,),
            )
        elif how == "failed queue a table":  # JSON's object, AMQP's table
            conn.execute(
                "UPDATE queue_messages SET headers_json = "
                "json_set(headers_json, '$.\"NServiceBus.FailedQ\"', json('{\"q\":1}')) "
                "WHERE id = ?",
                (row_id,),
            )
        elif how == "headers nested too deep":
            deep = "[" * 100_000 + "]" * 100_000
            conn.execute("UPDATE queue_messages SET headers_json = ? WHERE id = ?", (deep, row_id))


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("headers not json", "its headers are no JSON object"),
        ("headers a list", "its headers are no JSON object"),
        ("properties not json", "its broker properties are no JSON object"),
        ("body missing", "its body is missing"),
        # Breaker pass (fourth): these still crashed the intake worker in a loop.
        ("headers not utf-8", "not UTF-8"),
        ("properties not utf-8", "its broker properties are no JSON object"),
        ("headers nested too deep", "its headers are no JSON object"),
        # Breaker pass (fifth): a BLOB column (bytes, not text) crashed the worker in a
        # loop, every message behind it held.
        ("headers a blob", "not UTF-8"),
        ("properties a blob", "its broker properties are no JSON object"),
        # Breaker, session 32: stored as a failed message whose queue was the table's JSON.
        ("failed queue a table", "'NServiceBus.FailedQ' holds a table, where the wire"),
    ],
)
def test_a_row_the_embedded_queue_cannot_read_whole_is_a_failed_import(
    tmp_path: Path, database_url: str, engine: sa.Engine, how: str, reason: str
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        ingestion={"batch_size": 2, "linger_seconds": 0.2},
    )
    messages = [(failed_headers("damaged"), b"{}"), (failed_headers("fine"), b"{}")]

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            await publish_all(transport, settings.error_queue, messages)
            damage(settings.embedded_queue_path, "damaged", how)
            await ingest_until(
                settings,
                engine,
                transport,
                lambda: (
                    count(engine, failed_messages) == 1 and count(engine, failed_error_imports) == 1
                ),
            )
            assert await transport.purge(settings.error_queue) == 0

    asyncio.run(scenario())
    with engine.connect() as conn:
        assert conn.execute(sa.select(failed_messages.c.message_id)).scalar_one() == "fine"
        kept = conn.execute(sa.select(failed_error_imports)).one()
    assert reason in kept.reason
    if how in ("headers not json", "headers a list"):  # kept as it was stored
        assert json.loads(kept.headers_json)[UNREADABLE_STORED] in ("not json", "[]")
