"""docs/decisions.md "Every delivery is settled exactly once": every exception path of the ingestion
pipeline settles each delivery: committed and acknowledged, failed import and acknowledged, or given
back for redelivery. Per provider, on the embedded queue."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.tables import failed_error_imports, failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.exceptions import BodyStoreError, UnstorableValue
from controlroom.transport.embedded import EmbeddedQueue
from tests.integration.test_ingestion import count, publish_all
from tests.nsb import failed_headers

TIMEOUT = 30
REFUSED = b"\x00refused"


class FlakyBodyStore(FileSystemBodyStore):
    """Refuses one body as bad data (``UnstorableValue``, as the driver's refusal of a value
    is: a data error) and, once it did, fails every other write for a while
    (``BodyStoreError``: the store is failing), then heals."""

    failures_left = 3
    refused_once = False

    def put(self, key: str, data: bytes) -> None:
        if data == REFUSED:
            self.refused_once = True
            raise UnstorableValue("the store refuses this body")
        if self.refused_once and self.failures_left > 0:
            self.failures_left -= 1
            raise BodyStoreError("disk unavailable")
        super().put(key, data)


def test_a_store_failure_in_the_one_by_one_fallback_gives_the_batch_back(
    tmp_path, database_url: str, engine: sa.Engine
) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        ingestion={"batch_size": 2, "linger_seconds": 0.5, "max_backoff_seconds": 0.05},
    )
    binary = {"content_type": "application/octet-stream"}
    messages = [
        (failed_headers("refused", **binary), REFUSED),
        (failed_headers("fine", **binary), b"\x00fine"),
    ]

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            await publish_all(transport, settings.error_queue, messages)
            bodies = FlakyBodyStore(settings.body_dir)
            service = IngestionService(settings, engine, transport, bodies)
            task = asyncio.create_task(service.run())
            try:
                async with asyncio.timeout(TIMEOUT):
                    while not (
                        count(engine, failed_messages) == 1
                        and count(engine, failed_error_imports) == 1
                    ):
                        assert not task.done(), task.exception()
                        await asyncio.sleep(0.05)
            finally:
                await service.stop()
            assert await transport.purge(settings.error_queue) == 0

    asyncio.run(scenario())
    with engine.connect() as conn:
        assert conn.execute(sa.select(failed_messages.c.message_id)).scalar_one() == "fine"
