"""Real HTTP on loopback for the site tests: an ASGI app served by uvicorn on a free port,
and flaky HTTP targets for cached calls to call."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from controlroom.runtime.sockets import listen


def loopback_listener() -> socket.socket:
    """A listening socket on a free loopback port, made as the servers make theirs."""
    return listen("127.0.0.1", 0)


def url_of(listener: socket.socket) -> str:
    host, port = listener.getsockname()[:2]
    return f"http://{host}:{port}"


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.contextmanager
def serving(app: Any, listener: socket.socket | None = None) -> Iterator[str]:
    """Serve ``app`` on ``listener`` (a free loopback port by default) in a thread; yields
    its base URL; stops it on exit."""
    listener = listener or loopback_listener()
    server = _QuietServer(uvicorn.Config(app, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the test server did not start")
            thread.join(0.01)
        yield url_of(listener)
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()


class FlakyTargets:
    """HTTP targets of cached calls, each path a behaviour:

    - ``/recovers/{name}``: 503 until ``fixed`` holds ``name`` or it has failed
      ``fail_times[name]`` times, then 200;
    - ``/always-503/{name}``: 503 until ``fixed`` holds ``name``;
    - ``/reject/{name}``: 400.

    ``hits`` counts the requests per path. After ``hold_after[name]`` requests, the next
    ones wait for ``release`` (``holding`` is set while one waits): a caller caught in the
    middle of an attempt.
    """

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.fail_times: dict[str, int] = {}
        self.fixed: set[str] = set()
        self.hold_after: dict[str, int] = {}
        self.holding = threading.Event()
        self.release = threading.Event()
        self.app = FastAPI()
        self.app.add_api_route("/{kind}/{name}", self._handle, methods=["POST", "PUT", "GET"])

    async def _handle(self, kind: str, name: str, request: Request) -> JSONResponse:
        self.hits[f"/{kind}/{name}"] += 1
        if self.hits[f"/{kind}/{name}"] > self.hold_after.get(name, 10**9):
            self.holding.set()
            await asyncio.to_thread(self.release.wait, 60)
        if kind == "reject":
            return JSONResponse({"error": "the invoice number is malformed"}, 400)
        failures_left = self.fail_times.get(name, 10**9) - (self.hits[f"/{kind}/{name}"] - 1)
        if name in self.fixed or (kind == "recovers" and failures_left <= 0):
            return JSONResponse({"ok": True})
        return JSONResponse({"error": "upstream is down"}, 503)
