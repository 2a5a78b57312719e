"""Test helpers: consume in the background so a test can wait with timeouts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from controlroom.transport import Delivery, Transport

TransportFactory = Callable[[], Transport]


class Collector:
    """Runs ``transport.consume(queue, prefetch)`` in a task, buffering deliveries.

    Waiting with a timeout directly on ``__anext__`` would cancel (and so end) the
    iteration; waiting on this buffer does not.
    """

    def __init__(
        self, transport: Transport, queue: str, prefetch: int, max_bytes: int | None = None
    ) -> None:
        self._transport = transport
        self._queue = queue
        self._prefetch = prefetch
        self._max_bytes = max_bytes
        self._buffer: asyncio.Queue[Delivery] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Collector:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _run(self) -> None:
        consumer = self._transport.consume(self._queue, self._prefetch, max_bytes=self._max_bytes)
        async with contextlib.aclosing(consumer):  # type: ignore[type-var]
            async for delivery in consumer:
                await self._buffer.put(delivery)

    @property
    def done(self) -> bool:
        return self._task is not None and self._task.done()

    async def stop(self) -> None:
        """End the iteration (cancelling it, as a pipeline shutting down would)."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def get(self, timeout: float = 10.0) -> Delivery:
        """The next delivery; ``TimeoutError`` when none arrives within ``timeout`` s."""
        async with asyncio.timeout(timeout):
            return await self._buffer.get()

    async def get_many(self, count: int, timeout: float = 20.0) -> list[Delivery]:
        async with asyncio.timeout(timeout):
            return [await self._buffer.get() for _ in range(count)]

    async def assert_idle(self, seconds: float = 0.5) -> None:
        """Assert nothing (more) is delivered within ``seconds``."""
        await asyncio.sleep(seconds)
        assert self._buffer.empty(), f"unexpected delivery: {self._buffer.get_nowait()!r}"
