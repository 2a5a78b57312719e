"""Periodic background tasks: the one loop every scheduled singleton of the service runs.

``PeriodicTask.run()`` runs the work, then waits ``interval`` seconds (give or take
``jitter``, a fraction of it, drawn afresh each time, so processes started together
spread their attempts), and again, until cancelled; a failure is logged and the schedule
goes on (docs/design.md "Background singletons"):

- With a ``lease`` (``runtime.lease.Lease``) the work runs only while this process holds
  it: each run first holds (renews) it, and a process without it skips the run. The
  lease is released when the loop ends.
- Cancellation waits for the running work: a run (the lease's hold and the work, in a
  worker thread for a plain function, a task for a coroutine function) is shielded, and
  the loop waits for it to end before it stops and releases the lease, so that a second
  process can never take the lease and start the same work while this one still runs it
  in its thread. ``stopping`` is set first, so long work may end early at a safe point.
- A failed run is logged (warning, with its traceback) and the schedule goes on: the
  next run comes after ``interval``, or after ``interval * 2**failures`` up to
  ``max_backoff`` seconds when one is given.
- ``wake()`` (thread-safe) ends the current wait at once.
- Each successful run sets ``controlroom_periodic_last_success_timestamp_seconds`` (a
  Prometheus gauge, labelled by the task's name) to the current time (Unix seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import Gauge

from controlroom.runtime.lease import Lease

log = logging.getLogger(__name__)

LAST_SUCCESS = Gauge(
    "controlroom_periodic_last_success_timestamp_seconds",
    "When each periodic background task last ran to completion in this process (Unix time).",
    ["task"],
)

Work = Callable[[], Any] | Callable[[], Awaitable[Any]]
"""A run's work: a plain function (called in a worker thread) or a coroutine function."""


class PeriodicTask:
    """One periodic background task (module docstring).

    ``name`` names it in the log and the metric. ``interval`` is seconds between the end
    of one run and the start of the next (> 0); ``jitter`` a fraction in [0, 1) of it
    added or taken at random from each wait; ``max_backoff`` (seconds) makes the waits
    after consecutive failures grow up to it; ``first_delay`` (seconds) holds the first
    run back after ``run()`` starts (``wake()`` ends it early). Raises ``ValueError`` for a
    non-positive ``interval`` or ``max_backoff``, a negative ``first_delay`` or a
    ``jitter`` outside [0, 1).
    """

    def __init__(
        self,
        name: str,
        work: Work,
        *,
        interval: float,
        jitter: float = 0.0,
        lease: Lease | None = None,
        max_backoff: float | None = None,
        first_delay: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        if interval <= 0 or (max_backoff is not None and max_backoff <= 0):
            raise ValueError("interval and max_backoff must be positive")
        if first_delay < 0:
            raise ValueError("first_delay must not be negative")
        if not 0 <= jitter < 1:
            raise ValueError("jitter must be a fraction in [0, 1)")
        self.name = name
        self.stopping = threading.Event()
        """Set when the loop is cancelled: work that checks it may end early."""
        self._work = work
        self._interval = interval
        self._jitter = jitter
        self._lease = lease
        self._max_backoff = max_backoff
        self._first_delay = first_delay
        self._rng = rng or random.Random()
        self._failures = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None

    async def run(self) -> None:
        """Run the work on its schedule until cancelled; the lease (if any) is released
        only after the work has ended."""
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self.stopping.clear()
        try:
            if self._first_delay:
                await self._wait(self._first_delay)
            while True:
                self._wakeup.clear()
                failure = await self._run_shielded()
                delay = self.next_delay()
                if failure is not None:
                    log.warning("%s failed; next run in %.1f s", self.name, delay, exc_info=failure)
                await self._wait(delay)
        finally:
            self._wakeup = None
            if self._lease is not None:
                await asyncio.shield(asyncio.to_thread(_release, self._lease, self.name))

    async def _wait(self, seconds: float) -> None:
        """Until ``seconds`` have passed or ``wake()`` is called."""
        assert self._wakeup is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wakeup.wait()

    def wake(self) -> None:
        """Start the next run now rather than at the end of the wait. Thread-safe; a
        no-op while the loop is not running."""
        loop, event = self._loop, self._wakeup
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def next_delay(self) -> float:
        """Seconds to wait before the next run: the interval (grown after failures when
        ``max_backoff`` is set), jittered."""
        delay = self._interval
        if self._failures and self._max_backoff is not None:
            delay = min(self._max_backoff, self._interval * 2**self._failures)
        return delay * (1 + self._rng.uniform(-self._jitter, self._jitter))

    async def _run_shielded(self) -> Exception | None:
        """One run, shielded from cancellation; returns its failure, if any."""
        running = asyncio.ensure_future(self._run_once())
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            # Work in a thread cannot be interrupted: wait for it, so that the lease,
            # released after this, is never given up while the work still runs.
            self.stopping.set()
            await asyncio.wait({running})
            if not running.cancelled() and (failure := running.result()) is not None:
                log.warning("%s failed while stopping", self.name, exc_info=failure)
            raise

    async def _run_once(self) -> Exception | None:
        try:
            if self._lease is not None and not await asyncio.to_thread(self._lease.hold):
                return None  # another process holds the lease and runs the work
            if inspect.iscoroutinefunction(self._work):
                await self._work()
            else:
                await asyncio.to_thread(self._work)
        except Exception as exc:
            self._failures += 1
            return exc
        self._failures = 0
        LAST_SUCCESS.labels(self.name).set_to_current_time()
        return None


def _release(lease: Lease, name: str) -> None:
    try:
        lease.release()
    except Exception:
        log.warning("could not release the lease of %s", name, exc_info=True)
