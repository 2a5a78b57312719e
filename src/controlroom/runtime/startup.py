"""Waiting at start for what the service needs: the store and the broker (docs/design.md
"Operational contract": ``serve`` started before them waits, as a service under a
supervisor or in a container is expected to).

``wait_until_reachable`` tries a connection again with capped exponential back-off
(tenacity) while it fails in a way that a later try may cure (the caller's
``unreachable`` predicate), logging each failed try with what is unreachable and why;
past the deadline it raises ``DependencyUnreachable``, whose text is one line.
``said_while_slow`` logs, while a start-up step that has reached the store waits on it (a
lock another session holds), which step, every ``SLOW_STEP_SECONDS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import tenacity

from controlroom.exceptions import DependencyUnreachable

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_WAIT_SECONDS = 0.5
MAX_WAIT_SECONDS = 15.0
SLOW_STEP_SECONDS = 5.0  # how often a start-up step that waits on the store is said


class Stopped(Exception):
    """The service was asked to stop while it waited (not an error of the dependency)."""


async def wait_until_reachable(
    what: str,
    connect: Callable[[], Awaitable[T]],
    *,
    unreachable: Callable[[BaseException], bool],
    describe: Callable[[BaseException], str],
    deadline: float,
    stop: asyncio.Event,
    began: float | None = None,
) -> T:
    """Await ``connect()`` until it succeeds; return its result.

    ``what`` names the dependency in log lines and errors (e.g. ``"the database
    postgresql://u@h/db"``, no password). A failure for which ``unreachable(exc)`` is
    true is logged (warning: ``what``, ``describe(exc)``, the next wait in seconds) and
    tried again after 0.5 s, doubling up to 15 s, until ``deadline`` (the running loop's
    ``time()``); any other failure propagates at once. Raises ``DependencyUnreachable``
    (one line: ``what``, the seconds waited since ``began``, by default this call's start,
    and the last reason) past the deadline, and ``Stopped`` when ``stop`` is set meanwhile.
    """
    loop = asyncio.get_running_loop()
    started = loop.time() if began is None else began

    def log_wait(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        sleep = state.next_action.sleep if state.next_action is not None else 0.0
        left = max(0.0, deadline - loop.time())
        log.warning(
            "waiting for %s (try %d, %.1f s left): %s; %s try in %.1f s",
            what,
            state.attempt_number,
            left,
            describe(exc) if exc is not None else "unreachable",
            "last" if sleep >= left else "next",  # ``wait`` cut it to the deadline
            sleep,
        )

    async def sleep_unless_stopped(seconds: float) -> None:
        try:
            async with asyncio.timeout(seconds):
                await stop.wait()
        except TimeoutError:
            return
        raise Stopped

    backoff = tenacity.wait_exponential(multiplier=FIRST_WAIT_SECONDS, max=MAX_WAIT_SECONDS)

    def wait(state: tenacity.RetryCallState) -> float:
        return min(backoff(state), max(0.0, deadline - loop.time()))  # a last try at the deadline

    retrying = tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception(unreachable),
        wait=wait,
        stop=lambda _state: loop.time() >= deadline,
        sleep=sleep_unless_stopped,
        before_sleep=log_wait,
        reraise=True,
    )
    try:
        async for attempt in retrying:  # a loop, so that ``connect`` may be any callable
            with attempt:
                return await connect()
    except Exception as exc:
        if isinstance(exc, Stopped) or not unreachable(exc):
            raise
        waited = loop.time() - started
        raise DependencyUnreachable(
            f"{what} was still unreachable after {waited:.0f} s "
            f"(startup.wait_seconds): {describe(exc)}"
        ) from exc
    raise AssertionError("unreachable: tenacity either returns an attempt or raises")


@contextlib.contextmanager
def said_while_slow(step: str) -> Iterator[None]:
    """Log a warning every ``SLOW_STEP_SECONDS`` while the block (``step`` of serve's
    start-up, which blocks the event loop) has not ended: a step the store holds (a table
    another session locked) would otherwise wait without a line."""
    done = threading.Event()
    began = time.monotonic()

    def watch() -> None:
        while not done.wait(SLOW_STEP_SECONDS):
            log.warning(
                "start-up waits on the store: %s, for %.0f s so far (a lock another "
                "session holds?)",
                step,
                time.monotonic() - began,
            )

    watcher = threading.Thread(target=watch, name="controlroom-start-up-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
