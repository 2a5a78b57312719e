"""An intake's parsing waits at its ``pause`` before each message (a worker passes its
wait for serve's reads, docs/decisions.md "Reads first: the workers wait for serve's
reads"): while the pause holds, nothing is parsed and so nothing stored. Per provider."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.tables import failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.transport.embedded import EmbeddedQueue
from tests.integration.test_ingestion import count, publish_all, run_until
from tests.nsb import failed_headers


def test_nothing_is_parsed_while_the_intakes_pause_holds(
    tmp_path: Path, database_url: str, engine: sa.Engine
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data", database_url=database_url, ingestion={"linger_seconds": 0.1}
    )
    released = threading.Event()
    paused = threading.Event()

    def pause() -> None:
        paused.set()
        released.wait()

    stored_while_paused: list[int] = []

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            await publish_all(transport, settings.error_queue, [(failed_headers("a"), b"{}")])
            service = IngestionService(
                settings, engine, transport, FileSystemBodyStore(settings.body_dir), pause=pause
            )

            def done() -> bool:
                if paused.is_set() and not released.is_set():
                    stored_while_paused.append(count(engine, failed_messages))
                    released.set()
                return count(engine, failed_messages) == 1

            await run_until(service, done)

    asyncio.run(scenario())
    assert stored_while_paused == [0]
