"""``GET /api/health`` and ``/metrics`` say when intake is stuck (docs/design.md
"Operational contract"): ``serve`` (``server.run``, in-process) on each provider with a
body store whose writes fail for real (its directory is a regular file: every body write
raises ``NotADirectoryError``, as root too) holds the messages unacknowledged and reports
intake degraded (503, the reason, the gauges) while the database is fine; once the body
store can be written again the messages are stored and health is 200."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import sqlalchemy as sa

from controlroom import server
from controlroom.client import open_transport, publish_failed_message
from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.tables import failed_messages
from controlroom.runtime.sockets import listen
from tests.nsb import failed_headers
from tests.servers import TEST_CLIENT_TIMEOUT

TIMEOUT = 60.0
INTAKE = "error queue intake"
BINARY = b"\x00\x01 a binary body goes to the body store \xff"


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(TIMEOUT):
        while not await check():
            await asyncio.sleep(0.05)


def stored(url: str) -> int:
    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(
                sa.select(sa.func.count()).select_from(failed_messages)
            ).scalar_one()
    finally:
        engine.dispose()


def test_health_reports_intake_degraded_while_body_writes_fail(settings: Settings) -> None:
    settings = settings.model_copy(
        update={"ingestion": settings.ingestion.model_copy(update={"max_backoff_seconds": 0.1})}
    )
    settings.data_dir.mkdir(parents=True)
    settings.body_dir.write_text("not a directory")  # every body write fails for real
    seen: list[server.Serving] = []

    async def main() -> None:
        async with open_transport(settings) as transport:
            for n in range(3):
                headers = failed_headers(f"stuck-{n}", content_type="application/octet-stream")
                await publish_failed_message(transport, headers, BINARY + bytes([n]))
        stop = asyncio.Event()
        with listen("127.0.0.1", 0) as listener:
            running = asyncio.create_task(
                server.run(settings, listener=listener, stop=stop, on_serving=seen.append)
            )
            try:
                await until(lambda: asyncio.sleep(0, bool(seen)))
                async with httpx.AsyncClient(
                    base_url=seen[0].url, timeout=TEST_CLIENT_TIMEOUT
                ) as client:
                    await check_stuck_then_recovered(client, settings)
            finally:
                stop.set()
                await running

    asyncio.run(main())
    assert stored(settings.effective_database_url) == 3


async def check_stuck_then_recovered(client: httpx.AsyncClient, settings: Settings) -> None:
    answers: list[httpx.Response] = []

    async def degraded() -> bool:
        answers.append(await client.get("/api/health"))
        return answers[-1].json().get("intake", "ok") != "ok"

    await until(degraded)
    health = answers[-1]
    assert health.status_code == 503
    body = health.json()
    assert body["database"] == "ok"  # the store answers; its intake does not store
    assert body["intake"].startswith(f"degraded: {INTAKE}: writes failing since ")
    assert "BodyStoreError <- NotADirectoryError (Not a directory)" in body["intake"]
    assert str(settings.body_dir) not in body["intake"]  # no paths on the open route
    figures = body["details"]["intakes"][INTAKE]
    assert figures["queue"] == "error" and figures["write_failures"] >= 1
    assert figures["last_stored_at"] is None
    metrics = (await client.get("/metrics")).text
    assert f'controlroom_intake_degraded{{intake="{INTAKE}"}} 1.0' in metrics
    assert f'controlroom_intake_write_failures{{intake="{INTAKE}"}}' in metrics
    assert stored(settings.effective_database_url) == 0  # held, not lost

    settings.body_dir.unlink()
    settings.body_dir.mkdir()

    async def healthy() -> bool:
        answers.append(await client.get("/api/health"))
        return answers[-1].status_code == 200

    await until(healthy)
    body = answers[-1].json()
    assert body["intake"] == "ok"
    assert body["details"]["intakes"][INTAKE]["write_failures"] == 0
    assert body["details"]["intakes"][INTAKE]["last_stored_at"] is not None
    metrics = (await client.get("/metrics")).text
    assert f'controlroom_intake_degraded{{intake="{INTAKE}"}} 0.0' in metrics
