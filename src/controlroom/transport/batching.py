"""Batches of deliveries from one queue, handed to a writer, acknowledged after its commit.

Shared by every intake (the error queue, the site-call telemetry queue). Source: docs/design.md
"Process shape" (intake -> batcher -> unit of work -> writer, ack only after commit).
The batcher only groups deliveries; the handler decides, per batch, to ``ack_all`` after
its commit or ``reject_all`` to give the batch back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from controlroom.config import IngestionSettings
from controlroom.exceptions import ControlroomError
from controlroom.transport.base import Delivery, DeliveryLostError, Transport, ack_many

log = logging.getLogger(__name__)

BatchHandler = Callable[[list[Delivery]], Coroutine[Any, Any, None]]


class IntakeClosed(ControlroomError):
    """The transport stopped delivering messages (closed or failed)."""


class IntakeStop:
    """An intake's stop, in two steps (docs/decisions.md "A stop finishes the batches in
    hand"): once ``request``ed, the intake takes no more deliveries (``requested``); the
    batches it holds keep retrying a transient store failure until ``retries_over``,
    ``grace_seconds`` later or at ``finished``, whichever comes first. When the grace
    ends first, ``on_grace_end`` is called: the intake cancels the statements its batches
    still wait on (a lock may be held for ever). Thread-safe to read (a writer's retry
    policy sleeps on ``retries_over`` in a worker thread); ``request`` and ``finished``
    run on the intake's event loop."""

    def __init__(
        self, grace_seconds: float, on_grace_end: Callable[[], object] | None = None
    ) -> None:
        self.requested = threading.Event()
        self.retries_over = threading.Event()
        self._grace_seconds = grace_seconds
        self._on_grace_end = on_grace_end
        self._grace_ends: asyncio.TimerHandle | None = None

    def request(self) -> None:
        """Stop taking deliveries now; end the retries after the grace."""
        if self.requested.is_set():
            return
        self.requested.set()
        loop = asyncio.get_running_loop()
        self._grace_ends = loop.call_later(self._grace_seconds, self._grace_ended)

    def _grace_ended(self) -> None:
        self.retries_over.set()
        if self._on_grace_end is not None:
            self._on_grace_end()

    def finished(self) -> None:
        """The intake has ended: nothing is left to retry."""
        self.retries_over.set()
        if self._grace_ends is not None:
            self._grace_ends.cancel()

    async def end(self, run: asyncio.Task[None] | None) -> None:
        """``request`` the stop, cancel the intake's ``run`` task (its batcher then
        finishes the batches in hand) and wait for it; then ``finished``."""
        self.request()
        try:
            if run is not None and not run.done():
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
        finally:
            self.finished()


class DeliveryBatcher:
    """Drains ``queue`` into ``handle`` in batches of up to ``batch_size`` deliveries, at
    most ``concurrent_batches`` being handled at once. Not thread-safe: one event loop."""

    def __init__(
        self,
        transport: Transport,
        queue: str,
        settings: IngestionSettings,
        handle: BatchHandler,
    ) -> None:
        self._transport = transport
        self._queue = queue
        self._settings = settings
        self._handle = handle

    async def run(self, stopping: Callable[[], bool]) -> None:
        """Consume and hand over batches until ``stopping()`` or cancellation; waits for
        the batches in hand before returning. Raises ``IntakeClosed`` when the transport
        stops delivering."""
        # Unbounded here: the transport bounds unacknowledged deliveries, by count (prefetch)
        # and by bytes (max_inflight_bytes); a delivery counts until the handler settles it.
        inbox: asyncio.Queue[Delivery | None] = asyncio.Queue()
        slots = asyncio.Semaphore(self._settings.concurrent_batches)
        handling: dict[asyncio.Task[None], list[Delivery]] = {}  # each batch in hand
        feeder = asyncio.create_task(self._feed(inbox))
        try:
            while not stopping():
                deliveries = await self._next_batch(inbox)
                await slots.acquire()
                task = asyncio.create_task(self._handle(deliveries))
                handling[task] = deliveries
                task.add_done_callback(lambda done: handling.pop(done, None))
                task.add_done_callback(lambda _: slots.release())
        finally:
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
            # What the batches in hand hold is written and acknowledged (or given back)
            # before the intake ends; what is not in a batch yet goes back unsettled.
            if handling:
                in_hand = [delivery for batch in handling.values() for delivery in batch]
                log.info(
                    "the intake of %r ends: finishing %d %s in hand (%d messages)",
                    self._queue,
                    len(handling),
                    "batch" if len(handling) == 1 else "batches",
                    len(in_hand),
                )
                await asyncio.gather(*handling, return_exceptions=True)
                self._say_ended(in_hand)
            else:
                log.info("the intake of %r ends: no batch in hand", self._queue)

    def _say_ended(self, in_hand: list[Delivery]) -> None:
        """Say what became of the messages the batches in hand held at the stop: each
        acknowledged after its commit, or left to the queue to be delivered again."""
        stored = sum(delivery.acknowledged for delivery in in_hand)
        if stored == len(in_hand):
            log.info(
                "the intake of %r ended: the %d messages in hand stored and acknowledged",
                self._queue,
                stored,
            )
        else:
            log.info(
                "the intake of %r ended: %d of the %d messages in hand stored and "
                "acknowledged, %d left to the queue",
                self._queue,
                stored,
                len(in_hand),
                len(in_hand) - stored,
            )

    async def _feed(self, inbox: asyncio.Queue[Delivery | None]) -> None:
        stream = self._transport.consume(
            self._queue,
            self._settings.effective_prefetch,
            max_bytes=self._settings.max_inflight_bytes,
        )
        try:
            async with contextlib.aclosing(stream):
                async for delivery in stream:
                    await inbox.put(delivery)
        finally:
            # Wake the batcher: the intake ended (closed, cancelled or failed).
            inbox.put_nowait(None)

    async def _next_batch(self, inbox: asyncio.Queue[Delivery | None]) -> list[Delivery]:
        """Up to ``batch_size`` deliveries; a partial batch waits ``linger_seconds``."""
        first = await inbox.get()
        if first is None:
            raise IntakeClosed(f"the intake of {self._queue!r} stopped")
        batch = [first]
        deadline = time.monotonic() + self._settings.linger_seconds
        while len(batch) < self._settings.batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                # What already arrived is taken without a timer: one wait_for per delivery
                # cost the event loop more than the delivery itself (benchmarks/serve.py).
                item = inbox.get_nowait()
            except asyncio.QueueEmpty:
                try:
                    # Not asyncio.wait_for: on Python 3.11 it loses a cancellation that
                    # meets the delivery it waits for, and a stopping intake would start
                    # another batch (docs/decisions.md "A stop loses no cancellation").
                    async with asyncio.timeout(remaining):
                        item = await inbox.get()
                except TimeoutError:
                    break
            if item is None:
                inbox.put_nowait(None)  # seen again by the next call, which raises
                break
            batch.append(item)
        return batch


async def ack_all(deliveries: Sequence[Delivery]) -> None:
    """Acknowledge ``deliveries`` at once (``base.ack_many``: one transaction, one AMQP
    frame) after the commit that made them safe. When the transport fails, the unsettled
    ones are given back: the commit makes their redelivery harmless, and no delivery is
    left unsettled (docs/decisions.md "Every delivery is settled exactly once")."""
    try:
        await ack_many(deliveries)
    except DeliveryLostError:
        # Committed, but the transport will deliver some again; the replay changes nothing.
        log.warning("acknowledgements lost for messages of %s", _queues(deliveries))
    except Exception:
        log.warning(
            "could not acknowledge messages of %s; giving them back",
            _queues(deliveries),
            exc_info=True,
        )
        await reject_all(deliveries)


def _queues(deliveries: Sequence[Delivery]) -> str:
    return ", ".join(sorted({delivery.queue for delivery in deliveries}))


async def reject_all(deliveries: Sequence[Delivery]) -> None:
    """Give the unsettled ones of ``deliveries`` back to their queue, to be delivered
    again."""
    for delivery in deliveries:
        if delivery.settled:
            continue
        with contextlib.suppress(Exception):  # the broker may be gone; it redelivers anyway
            await delivery.reject(requeue=True)
