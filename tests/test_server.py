"""The composition root (``controlroom.server.run``) run in-process, without typer or a
subprocess: it serves until ``stop``, and a part that dies takes the service down."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import httpx
import pytest
import sqlalchemy as sa

from controlroom import server
from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.providers import provider_for
from controlroom.runtime import startup
from controlroom.runtime.sockets import listen
from controlroom.sitecalls.demo import generate_demo_telemetry
from controlroom.sitecalls.history import KpiSampler
from controlroom.sitecalls.retention import SiteCallRetention
from tests.nodelay import accepted_with_nodelay
from tests.servers import TEST_CLIENT_TIMEOUT

T = TypeVar("T")
TIMEOUT = 60.0


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The embedded default (SQLite file, embedded queue) in a fresh data dir."""
    return Settings(data_dir=tmp_path / "data")


def serving(
    settings: Settings,
    body: Callable[[server.Serving, Callable[[], Awaitable[None]]], Awaitable[T]],
) -> T:
    """Run ``server.run`` on a loopback socket; once it serves, call ``body`` with its
    announcement and ``stop_and_wait`` (sets the stop, waits for the end), which runs after
    ``body`` too."""

    async def main() -> T:
        stop = asyncio.Event()
        seen: list[server.Serving] = []
        with listen("127.0.0.1", 0) as listener:
            running = asyncio.create_task(
                server.run(settings, listener=listener, stop=stop, on_serving=seen.append)
            )

            async def stop_and_wait() -> None:
                stop.set()
                await running

            async with asyncio.timeout(TIMEOUT):
                while not seen:
                    await asyncio.sleep(0.01)
                try:
                    return await body(seen[0], stop_and_wait)
                finally:
                    await stop_and_wait()

    return asyncio.run(main())


def test_run_serves_until_stop_is_set(settings: Settings) -> None:
    async def health(serving: server.Serving, _: Callable[[], Awaitable[None]]) -> tuple[int, bool]:
        async with httpx.AsyncClient(base_url=serving.url, timeout=TEST_CLIENT_TIMEOUT) as client:
            return (await client.get("/api/health")).status_code, serving.ingesting

    assert serving(settings, health) == (200, True)


def test_a_client_that_does_not_read_its_answers_does_not_hold_the_stop(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breaker pass (fourth): a client sending pipelined requests and reading none of
    the answers kept serve "Waiting for connections to close" after SIGTERM for as long
    as it stayed; answers under way get ``HTTP_STOP_SECONDS``, then are cut."""
    monkeypatch.setattr(server, "HTTP_STOP_SECONDS", 1)

    async def stalled_at_the_stop(
        serving: server.Serving, stop_and_wait: Callable[[], Awaitable[None]]
    ) -> None:
        parts = urlsplit(serving.url)
        with socket.socket() as stalled:
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            stalled.connect((parts.hostname, parts.port))
            request = f"GET /openapi.json HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n"
            stalled.sendall(request.encode() * 40)
            await asyncio.sleep(1)  # its answers fill the buffers, unread
            await stop_and_wait()  # within the timeout, the client still connected

    heard: list[logging.LogRecord] = []

    class Heard(logging.Handler):  # on uvicorn's logger itself: it may not propagate
        def emit(self, record: logging.LogRecord) -> None:
            heard.append(record)

    handler = Heard()
    logging.getLogger("uvicorn.error").addHandler(handler)
    try:
        serving(settings, stalled_at_the_stop)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
    # Breaker's pass (session 31): each answer cut was a traceback of CancelledError.
    assert [r for r in heard if r.exc_info is None and "cut at the stop" in r.getMessage()]
    assert not [r for r in heard if r.exc_info is not None], [r.getMessage() for r in heard]
    # uvicorn's own "Cancel N running task(s)" is the same stop's doing: not an error.
    assert not [r for r in heard if r.levelno >= logging.ERROR], [r.getMessage() for r in heard]


def test_every_connection_serve_accepts_has_tcp_nodelay(settings: Settings) -> None:
    # run binds its own socket here, as `controlroom serve` does.
    seen: list[server.Serving] = []

    async def main() -> bool:
        stop = asyncio.Event()
        running = asyncio.create_task(
            server.run(settings.model_copy(update={"port": 0}), stop=stop, on_serving=seen.append)
        )
        async with asyncio.timeout(TIMEOUT):
            while not seen:
                await asyncio.sleep(0.01)
            address = urlsplit(seen[0].url)
            assert address.hostname is not None and address.port is not None
            nodelay = await asyncio.to_thread(accepted_with_nodelay, address.hostname, address.port)
            stop.set()
            await running
        return nodelay

    assert asyncio.run(main())


def test_a_part_that_raises_ends_run_with_its_error_logged_and_cancels_the_others(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cancelled: list[str] = []

    async def dies(self: KpiSampler) -> None:
        await asyncio.sleep(0.2)
        raise RuntimeError("the sampler broke")

    async def runs_until_cancelled(self: SiteCallRetention) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append("site-call purge")
            raise

    monkeypatch.setattr(KpiSampler, "run", dies)
    monkeypatch.setattr(SiteCallRetention, "run", runs_until_cancelled)

    async def main() -> None:
        async with asyncio.timeout(TIMEOUT):
            await server.run(settings.model_copy(update={"port": 0}))

    with (
        caplog.at_level(logging.ERROR, logger="controlroom.server"),
        pytest.raises(server.PartStopped) as stopped,
    ):
        asyncio.run(main())

    assert stopped.value.part == "KPI sampler"
    assert isinstance(stopped.value.__cause__, RuntimeError)
    assert cancelled == ["site-call purge"]
    [record] = [r for r in caplog.records if r.name == "controlroom.server"]
    assert record.getMessage() == "KPI sampler stopped"
    assert record.exc_info is not None and str(record.exc_info[1]) == "the sampler broke"


def test_a_part_that_returns_on_its_own_ends_run(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def returns(self: KpiSampler) -> None:
        await asyncio.sleep(0.2)

    monkeypatch.setattr(KpiSampler, "run", returns)

    async def main() -> None:
        async with asyncio.timeout(TIMEOUT):
            await server.run(settings.model_copy(update={"port": 0}))

    with (
        caplog.at_level(logging.ERROR, logger="controlroom.server"),
        pytest.raises(server.PartStopped, match="KPI sampler stopped"),
    ):
        asyncio.run(main())
    assert "KPI sampler stopped on its own" in caplog.text


def test_the_kpi_sampler_samples_again_as_soon_as_the_first_telemetry_is_written(
    settings: Settings,
) -> None:
    # Samples an hour apart: the one at start saw no telemetry; the next must not wait.
    hourly = settings.model_copy(
        update={"kpi": settings.kpi.model_copy(update={"sample_seconds": 3600.0})}
    )
    seen: list[server.Serving] = []

    async def latest_buffered(client: httpx.AsyncClient) -> float | None:
        answer = await client.get("/api/kpi-history", params={"metric": "buffered"})
        assert answer.status_code == 200, answer.text
        points = answer.json()["points"]
        return points[-1]["value"] if points else None

    async def main() -> float | None:
        stop = asyncio.Event()
        running = asyncio.create_task(
            server.run(hourly.model_copy(update={"port": 0}), stop=stop, on_serving=seen.append)
        )
        async with asyncio.timeout(TIMEOUT):
            while not seen:
                await asyncio.sleep(0.01)
            async with httpx.AsyncClient(
                base_url=seen[0].url, timeout=TEST_CLIENT_TIMEOUT
            ) as client:
                while await latest_buffered(client) is None:  # the sample at start
                    await asyncio.sleep(0.05)
                packets = generate_demo_telemetry(seed=5, now=datetime.now(UTC))
                answer = await client.post("/api/site-calls/telemetry", json=packets)
                assert answer.status_code == 200, answer.text
                while not await latest_buffered(client):
                    await asyncio.sleep(0.05)
                value = await latest_buffered(client)
            stop.set()
            await running
        return value

    assert (asyncio.run(main()) or 0) > 0


def start_and_stop_logging_warnings(
    tmp_path: Path, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Serve on ``database_url`` until it serves, then stop it, capturing its warnings."""
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url, port=0)
    seen: list[server.Serving] = []

    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(server.run(settings, stop=stop, on_serving=seen.append))
        async with asyncio.timeout(TIMEOUT):
            while not seen:
                await asyncio.sleep(0.01)
            stop.set()
            await running

    with caplog.at_level(logging.WARNING, logger="controlroom.server"):
        asyncio.run(main())


def test_serve_warns_at_start_when_the_stores_autovacuum_is_off(
    tmp_path: Path, postgresql_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The server's setting cannot change from a test: the warning follows SHOW autovacuum.
    start_and_stop_logging_warnings(tmp_path, postgresql_url, caplog)
    engine = sa.create_engine(postgresql_url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        autovacuum = conn.exec_driver_sql("SHOW autovacuum").scalar_one()
    engine.dispose()

    warned = [r.getMessage() for r in caplog.records if "autovacuum is off" in r.getMessage()]
    assert bool(warned) == (autovacuum == "off")
    for warning in warned:
        assert "dead rows" in warning and "slower" in warning
        # Fresh user's pass (session 31): a drained store never analyzed answered a broad
        # console search in 9 s with an estimate an eighth of the count.
        assert "nothing analyzes the tables" in warning and "estimated counts" in warning


def test_serve_warns_at_start_of_memory_and_wal_settings_that_grow_the_write_paths_cost(
    tmp_path: Path, postgresql_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The server's settings cannot change from a test: the warnings follow what the
    # provider reads of them once the store is migrated (docs/decisions.md "The write
    # path's cost does not grow with the store").
    start_and_stop_logging_warnings(tmp_path, postgresql_url, caplog)
    engine = sa.create_engine(postgresql_url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        expected = provider_for(conn).server_settings_warnings(conn)
    engine.dispose()

    logged = [r.getMessage() for r in caplog.records]
    assert [m for m in logged if m.startswith(("store: shared_buffers", "store: checkpoints"))] == [
        f"store: {warning}" for warning in expected
    ]


def test_a_start_up_step_the_store_holds_is_said_while_it_waits(
    tmp_path: Path,
    postgresql_url: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Breaker's pass (session 32): with a table locked by another session serve's start
    waited 49 s without a line. While a start-up step waits on the store, serve says which,
    every ``startup.SLOW_STEP_SECONDS``."""
    monkeypatch.setattr(startup, "SLOW_STEP_SECONDS", 0.2)
    engine = create_store_engine(postgresql_url)
    upgrade_database(engine)
    locked, release = threading.Event(), threading.Event()

    def hold_the_table() -> None:
        with engine.connect() as conn:
            conn.exec_driver_sql("LOCK TABLE failed_messages IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(TIMEOUT)
            conn.rollback()

    def release_once_said() -> None:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and not any(
            "start-up waits on the store" in r.getMessage() for r in list(caplog.records)
        ):
            time.sleep(0.05)
        release.set()

    holder = threading.Thread(target=hold_the_table)
    holder.start()
    watcher = threading.Thread(target=release_once_said)
    try:
        assert locked.wait(TIMEOUT)
        watcher.start()
        start_and_stop_logging_warnings(tmp_path, postgresql_url, caplog)
    finally:
        release.set()
        holder.join()
        if watcher.is_alive() or watcher.ident is not None:
            watcher.join()
        engine.dispose()
    said = [r.getMessage() for r in caplog.records if "start-up waits" in r.getMessage()]
    assert said and all(m.startswith("start-up waits on the store: ") for m in said), said
