"""Fixtures of the console tests: the app in-process (``console``, ``store``), the whole
process under uvicorn on a free loopback port, and Debian's Chromium
(``/usr/bin/chromium``) driven by Playwright.

``console_server`` runs what ``controlroom serve`` runs (HTTP, ingestion from the
embedded error queue, the retry processor) on each provider, in a thread with its own
event loop. The test consumer that processes retried messages and confirms them is
started by the test when it wants the confirmation (``start_consumer``).

Every page a test opens is fenced: a request to anything but 127.0.0.1 is aborted and
recorded, and a dialog (``alert``) is dismissed and recorded; the test fails at teardown
when either list is not empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa
import uvicorn
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlroom.app import create_app
from controlroom.client import publish_failed_message
from controlroom.config import Settings
from controlroom.db.tables import failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.runtime.sockets import listen
from controlroom.transport.embedded import EmbeddedQueue
from tests import servers
from tests.nsb import failed_headers
from tests.retries.conftest import TIMEOUT, make_processor, store_failed, wait_for_sync
from tests.retries.endpoint import FlakyEndpoint

CHROMIUM = Path("/usr/bin/chromium")
LOOPBACK = "127.0.0.1"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request the server answered: its path and the bytes of its answer as sent
    (after compression): the headers, as an HTTP/1.1 status line and header lines would
    take them, and the body."""

    path: str
    header_bytes: int
    body_bytes: int


@dataclass
class ConsoleServer:
    """A running process: its URL, its parts, and a handle on its event loop."""

    base_url: str
    settings: Settings
    engine: sa.Engine
    body_store: FileSystemBodyStore
    loop: asyncio.AbstractEventLoop
    transport: EmbeddedQueue
    exchanges: list[Exchange]
    consumers: list[FlakyEndpoint] = field(default_factory=list)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the server's loop; its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT)

    def publish(self, headers: Mapping[str, str | None], body: bytes) -> None:
        """Put a failed message on the error queue, as an endpoint's recoverability does."""
        self.run(
            publish_failed_message(
                self.transport, headers, body, error_queue=self.settings.error_queue
            )
        )

    def wait_until_stored(self, count: int) -> None:
        """Wait until ingestion has stored ``count`` failed messages."""

        def stored() -> bool:
            with self.engine.connect() as conn:
                query = sa.select(sa.func.count()).select_from(failed_messages)
                return conn.execute(query).scalar_one() >= count

        wait_for_sync(stored)

    def start_consumer(self, queue: str) -> FlakyEndpoint:
        """Start the test consumer of ``queue``: it processes each retried message and
        confirms it (``confirm_successful_retry``), as an NServiceBus endpoint does."""

        async def start() -> FlakyEndpoint:
            endpoint = FlakyEndpoint(
                self.transport,
                queue=queue,
                error_queue=self.settings.error_queue,
                address=queue,
                fail_times=0,
            )
            return await endpoint.__aenter__()

        consumer = self.run(start())
        self.consumers.append(consumer)
        return consumer


ServerFactory = Callable[[Settings], ConsoleServer]


@pytest.fixture
def start_console(engine: sa.Engine) -> Iterator[ServerFactory]:
    """Start the process with given settings (over the ``engine`` fixture's store)."""
    stops: list[Callable[[], None]] = []

    def start(settings: Settings) -> ConsoleServer:
        server, stop = _start(settings, engine)
        stops.append(stop)
        return server

    yield start
    for stop in reversed(stops):
        stop()


@pytest.fixture
def console_server(start_console: ServerFactory, settings: Settings) -> ConsoleServer:
    """The process on the embedded default (no tokens: the open console), per provider."""
    return start_console(settings)


# --- the app in-process (no browser) ------------------------------------------------------
@pytest.fixture
def store(
    settings: Settings, writer: FailedMessageBatchWriter, body_store: FileSystemBodyStore
) -> Any:
    """``store(message_id, body, **headers)`` -> its UniqueMessageId."""

    def put(
        message_id: str, body: bytes, extra: dict[str, str] | None = None, **options: Any
    ) -> str:
        headers = {**failed_headers(message_id, **options), **(extra or {})}
        return store_failed(settings, writer, body_store, headers, body).unique_message_id

    return put


@pytest.fixture
def console(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> Iterator[TestClient]:
    """The open console (no tokens) through Starlette's test client, redirects not followed."""
    with TestClient(create_app(settings, engine, body_store), follow_redirects=False) as client:
        yield client


def _start(settings: Settings, engine: sa.Engine) -> tuple[ConsoleServer, Callable[[], None]]:
    listener = listen(LOOPBACK, 0)
    port = listener.getsockname()[1]
    body_store = FileSystemBodyStore(settings.body_dir)
    started = threading.Event()
    holder: dict[str, Any] = {}
    exchanges: list[Exchange] = []

    async def main() -> None:
        stop = asyncio.Event()
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            processor = make_processor(settings, engine, transport, body_store)
            ingestion = IngestionService(settings, engine, transport, body_store)
            app = create_app(
                settings,
                engine,
                body_store,
                transport=transport,
                retry_processor=processor,
                intakes=[ingestion.health],  # the dashboard's intake tiles, as serve's
            )
            recorded = _recording(app, exchanges)
            http = uvicorn.Server(uvicorn.Config(recorded, lifespan="off", log_level="warning"))
            tasks = [
                asyncio.create_task(http.serve(sockets=[listener])),
                asyncio.create_task(processor.run()),
                asyncio.create_task(ingestion.run()),
            ]
            while not http.started:
                await asyncio.sleep(0.01)
            holder.update(loop=asyncio.get_running_loop(), transport=transport, stop=stop)
            started.set()
            try:
                await stop.wait()
            finally:
                for consumer in holder["server"].consumers:
                    await consumer.__aexit__(None, None, None)
                await ingestion.stop()
                http.should_exit = True
                await tasks[0]
                for task in tasks[1:]:
                    task.cancel()
                await asyncio.gather(*tasks[1:], return_exceptions=True)
                await processor.close()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced by the test through `started` below
            holder["error"] = exc
            started.set()

    thread = threading.Thread(target=run, name="console-server", daemon=True)
    thread.start()
    started.wait(TIMEOUT)
    if "error" in holder or "loop" not in holder:
        raise RuntimeError(f"the console server did not start: {holder.get('error')!r}")
    server = ConsoleServer(
        base_url=f"http://{LOOPBACK}:{port}",
        settings=settings,
        engine=engine,
        body_store=body_store,
        loop=holder["loop"],
        transport=holder["transport"],
        exchanges=exchanges,
    )
    holder["server"] = server

    def stop() -> None:
        server.loop.call_soon_threadsafe(holder["stop"].set)
        thread.join(TIMEOUT)
        listener.close()

    return server, stop


def _recording(app: ASGIApp, exchanges: list[Exchange]) -> ASGIApp:
    """``app``, appending an ``Exchange`` to ``exchanges`` for each answer it finishes."""

    async def recorded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        sizes = {"headers": 0, "body": 0}

        async def measuring(message: Message) -> None:
            if message["type"] == "http.response.start":
                lines = [len(name) + len(value) + 4 for name, value in message["headers"]]
                sizes["headers"] = len("HTTP/1.1 200 OK\r\n\r\n") + sum(lines)
            elif message["type"] == "http.response.body":
                sizes["body"] += len(message.get("body", b""))
                if not message.get("more_body", False):
                    exchanges.append(Exchange(scope["path"], sizes["headers"], sizes["body"]))
            await send(message)

        await app(scope, receive, measuring)

    return recorded


# --- the browser --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Debian's Chromium, headless, launched by path (never a downloaded browser)."""
    if not CHROMIUM.exists():
        servers.missing_browser(f"{CHROMIUM} is missing (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Fence:
    """What a page tried that it must not: requests off loopback, dialogs."""

    blocked: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)


@pytest.fixture
def fence() -> Fence:
    return Fence()


@pytest.fixture
def browser_context(chromium: Any, fence: Fence) -> Iterator[Any]:
    """A fresh browser profile (no cookies) at 1280x800, fenced to loopback."""
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(TIMEOUT * 1000)

    def guard(route: Any) -> None:
        if urlsplit(route.request.url).hostname == LOOPBACK:
            route.continue_()
        else:
            fence.blocked.append(route.request.url)
            route.abort()

    context.route("**/*", guard)

    def on_page(page: Any) -> None:
        def on_dialog(dialog: Any) -> None:
            fence.dialogs.append(f"{dialog.type}: {dialog.message}")
            with contextlib.suppress(Exception):
                dialog.dismiss()

        page.on("dialog", on_dialog)

    context.on("page", on_page)
    yield context
    context.close()
    assert fence.blocked == [], f"requests left 127.0.0.1: {fence.blocked}"
    assert fence.dialogs == [], f"dialogs opened: {fence.dialogs}"


@pytest.fixture
def page(browser_context: Any) -> Any:
    return browser_context.new_page()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of this directory that opens a page is a browser test."""
    for item in items:
        if "chromium" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
