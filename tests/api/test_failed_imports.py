"""Failed imports over the API (list, re-import one, re-import all) on the embedded queue,
per provider (docs/decisions.md "Failed imports are served over the API")."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom import events
from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import make_failed_import
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.transport.embedded import EmbeddedQueue


def test_list_reimport_one_and_all(
    settings: Settings,
    engine: sa.Engine,
    body_store: FileSystemBodyStore,
    writer: FailedMessageBatchWriter,
) -> None:
    kept = [
        make_failed_import({"n": str(n)}, b"\xff%d" % n, queue="error", reason=f"reason {n}")
        for n in range(3)
    ]
    writer.write(IngestionBatch(failed_imports=kept))

    async def scenario() -> int:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            app = create_app(settings, engine, body_store, transport=transport)

            # The test client runs the app on its own loop, in another thread; the
            # transport lives on this one, so the calls go through a thread.
            def calls() -> None:
                with TestClient(app) as client:
                    listed = client.get("/api/failed-imports", params={"per_page": 2})
                    assert listed.status_code == 200, listed.text
                    assert listed.headers["Total-Count"] == "3"
                    first = listed.json()[0]
                    assert set(first) == {
                        "id",
                        "queue",
                        "reason",
                        "failed_at",
                        "headers",
                        "body_size",
                    }
                    assert first["reason"].startswith("reason ") and first["body_size"] == 2
                    assert first["headers"] == {"n": first["reason"][-1]}

                    one = client.post(f"/api/failed-imports/{first['id']}/reimport")
                    assert one.status_code == 202 and one.json() == {"outcome": "republished"}
                    gone = client.post(f"/api/failed-imports/{first['id']}/reimport")
                    assert gone.status_code == 404
                    rest = client.post("/api/failed-imports/reimport-all")
                    assert rest.json() == {
                        "republished": 2,
                        "unreadable": 0,
                        "gone": 0,
                        "failed": 0,
                        "kept": [],
                    }
                    assert client.get("/api/failed-imports").headers["Total-Count"] == "0"

            await asyncio.to_thread(calls)
            return await transport.purge(settings.error_queue)

    assert asyncio.run(scenario()) == 3  # all three back on the error queue
    with engine.connect() as conn:
        logged = events.list_events(conn, offset=0, limit=20).items
    assert [i.event_type for i in logged].count("FailedImportsReimported") == 3


def test_reimport_without_a_transport_is_503(client: TestClient) -> None:
    assert client.post("/api/failed-imports/reimport-all").status_code == 503
