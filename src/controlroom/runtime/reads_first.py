"""Reads first: a worker's store statements wait while serve answers a read.

A lower CPU priority alone leaves the console's reads slowed by the drain on two cores:
each of a read's hand-offs waits for a running worker or backend to be preempted, and the
two share the caches (docs/decisions.md "Reads first: the workers wait for serve's
reads"). So serve counts the reads it is answering (``CountReads``, GET and HEAD: a write
of the console may wait on a lock a worker holds, and must not make that worker wait for
it) in memory shared with its workers (``ReadsInFlight``), and before each statement a
worker sends to the store it waits while any is in flight (``YieldToReads``), for at most
``share`` of its time: with a reader that never stops, the drain keeps ``1 - share`` of
its pace.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
import time
from collections.abc import Callable
from multiprocessing.context import SpawnContext
from typing import Any, Final

from prometheus_client import Counter

POLL_SECONDS: Final = 0.001
"""How often a waiting statement looks again whether the reads are answered."""

YIELDED = Counter(
    "controlroom_worker_waited_for_reads_seconds",
    "Seconds a worker's store statements waited for serve's reads (ingestion.yield_to_reads).",
)
READING = Counter(
    "controlroom_intake_weight_reads_seconds",
    "Seconds serve answered at least one read while intake's cgroup weight followed the reads.",
)
LOWERED = Counter(
    "controlroom_intake_weight_lowered_seconds",
    "Seconds intake's cgroup weighed the least for serve's reads (at most "
    "ingestion.yield_to_reads of the time).",
)


class ReadsInFlight:
    """How many reads serve is answering: one integer in shared memory that serve's event
    loop alone writes (``CountReads``) and its workers read (``YieldToReads``)."""

    def __init__(self, value: Any) -> None:
        self._value = value

    @classmethod
    def shared(cls, context: SpawnContext) -> ReadsInFlight:
        """A count of zero in memory that processes of ``context`` inherit."""
        return cls(context.RawValue(ctypes.c_int, 0))

    @property
    def count(self) -> int:
        """The reads in flight now."""
        return int(self._value.value)

    def add(self, reads: int) -> None:
        """Count ``reads`` more (negative: fewer). One writer only: serve's event loop."""
        self._value.value += reads


PROBES: Final = frozenset({"/api/health", "/metrics"})
"""Paths whose GETs are not counted as reads: a supervisor's health checks and
Prometheus's scrapes are no operator waiting on the console."""


class CountReads:
    """ASGI middleware: counts each GET and HEAD request in ``reads`` while the app answers
    it, however the answer ends; not those of ``PROBES``. ``on_reading`` hears ``True``
    when the count goes from none to one and ``False`` when it is back to none (intake's
    cgroup weight, ``runtime.intake_cgroup``)."""

    def __init__(
        self, app: Any, reads: ReadsInFlight, *, on_reading: Callable[[bool], None] | None = None
    ) -> None:
        self._app = app
        self._reads = reads
        self._on_reading = on_reading

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] not in ("GET", "HEAD")
            or scope.get("path") in PROBES
        ):
            await self._app(scope, receive, send)
            return
        self._count(1)
        try:
            await self._app(scope, receive, send)
        finally:
            self._count(-1)

    def _count(self, reads: int) -> None:
        self._reads.add(reads)
        if self._on_reading is not None and self._reads.count == (1 if reads > 0 else 0):
            self._on_reading(reads > 0)


class ShareOfTime:
    """Seconds that may be spent at most ``share`` (0 to 1) of the time: a budget that
    grows by ``share`` seconds a second up to ``burst`` and shrinks by a second a second
    while spent, so that over any stretch of time what is spent adds up to at most
    ``share`` of it plus ``burst``. Not thread-safe: its owner serialises ``settle``."""

    def __init__(self, share: float, burst: float, clock: Callable[[], float]) -> None:
        self.share = share
        self._burst = burst
        self._clock = clock
        self.left = burst
        """Seconds that may be spent now, as of the last ``settle``."""
        self.settled_at = clock()
        """When the last ``settle`` was, on ``clock``."""

    def settle(self, spending: bool) -> float:
        """Bring ``left`` to now, ``spending`` telling whether the budget was spent since
        the last call; returns the seconds spent."""
        now = self._clock()
        elapsed, self.settled_at = now - self.settled_at, now
        spent = elapsed if spending else 0.0
        self.left = min(self._burst, self.left + self.share * elapsed - spent)
        return spent


class YieldToReads:
    """The wait of a worker's statements (``wait``), shared by the worker's threads.

    ``share`` (0 to 1) is the most of the worker's time spent waiting, kept by a budget
    that grows by ``share`` seconds a second up to ``BURST_SECONDS`` and shrinks by a
    second a second while any of its statements waits (the worker's time, not each
    thread's): over any stretch of time the waits add up to at most ``share`` of it plus
    the burst. 0 never waits; 1 waits as long as reads are in flight. ``waited_seconds``
    is that waiting so far; ``waiting`` is set while a statement waits.
    """

    BURST_SECONDS: Final = 0.25

    def __init__(
        self,
        reads: ReadsInFlight,
        *,
        share: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._reads = reads
        self._sleep = sleep
        self._lock = threading.Lock()
        self._budget = ShareOfTime(share, self.BURST_SECONDS, clock)
        self._waiters = 0
        self._stopping = threading.Event()
        self.waited_seconds = 0.0
        self.waiting = threading.Event()

    @property
    def idle(self) -> bool:
        """True when ``wait`` would return at once: no read in flight, a share of 0, or
        the worker's stop begun."""
        return self._budget.share <= 0 or self._reads.count <= 0 or self._stopping.is_set()

    def stop_waiting(self) -> None:
        """Never wait from now on, and end the waits under way: at the worker's stop its
        batches in hand go first, since serve ends its reads only after its workers
        (docs/decisions.md "Reads first: the workers wait for serve's reads")."""
        self._stopping.set()

    def wait(self) -> None:
        """Return once no read is in flight, or once the budget is spent."""
        if self.idle:
            return
        with self._lock:
            self._settle()
            self._waiters += 1
            self.waiting.set()
        try:
            # A poll past the budget is owed: the next stretches without waiting pay it.
            while not self.idle and self._budget_left() > 0:
                self._sleep(POLL_SECONDS)
        finally:
            with self._lock:
                self._settle()
                self._waiters -= 1
                if not self._waiters:
                    self.waiting.clear()

    def _budget_left(self) -> float:
        with self._lock:
            self._settle()
            return self._budget.left

    def _settle(self) -> None:
        """Bring the budget to now (the caller holds the lock)."""
        waited = self._budget.settle(self._waiters > 0)
        if waited:
            self.waited_seconds += waited
            YIELDED.inc(waited)


class WeighIntake:
    """Intake's cgroup weight in step with serve's reads (``reading``, from
    ``CountReads``), for at most ``share`` of the time: ``lower(True)`` when a read starts
    while the budget (``ShareOfTime``, ``BURST_SECONDS``) has ``MIN_LOWERED_SECONDS``,
    ``lower(False)`` when the reads end or the budget is spent, and lowered again while
    the reads go on as soon as it has grown back. So a reader that never stops leaves the
    drain ``1 - share`` of its pace on a machine busy with other work, as ``YieldToReads``
    leaves it on a quiet one (docs/decisions.md "Intake's weight follows the reads").
    ``reading_seconds`` and ``lowered_seconds`` (also in ``/metrics``) are the seconds
    reads were answered and the weight was down for them so far. Runs on serve's event
    loop (``call_later`` defaults to the running loop's)."""

    BURST_SECONDS: Final = YieldToReads.BURST_SECONDS
    MIN_LOWERED_SECONDS: Final = 0.02
    """The least budget worth lowering the weight for (two writes to the cgroup's file)."""

    _SPENT: Final = 0.001  # a budget below this is spent

    def __init__(
        self,
        lower: Callable[[bool], None],
        *,
        share: float,
        clock: Callable[[], float] = time.monotonic,
        call_later: Callable[[float, Callable[[], None]], asyncio.TimerHandle] | None = None,
    ) -> None:
        self._lower = lower
        self._budget = ShareOfTime(share, self.BURST_SECONDS, clock)
        self._call_later = call_later
        self._reading = False
        self._lowered = False
        self._timer: asyncio.TimerHandle | None = None
        self.reading_seconds = 0.0
        self.lowered_seconds = 0.0

    def reading(self, reads: bool) -> None:
        """Serve answers a read from now on (``True``), or none any more (``False``)."""
        self._settle()
        self._reading = reads
        self._update()

    def _look_again(self) -> None:
        self._settle()
        self._update()

    def _settle(self) -> None:
        """Bring the budget and the seconds counted to now (one reading of the clock, so
        the seconds lowered never exceed those reading)."""
        since = self._budget.settled_at
        lowered = self._budget.settle(self._lowered)
        if self._reading:
            self.reading_seconds += self._budget.settled_at - since
            READING.inc(self._budget.settled_at - since)
        self.lowered_seconds += lowered
        LOWERED.inc(lowered)

    def _update(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        share, left = self._budget.share, self._budget.left
        lower = (
            self._reading
            and share > 0
            and left >= (self._SPENT if self._lowered else self.MIN_LOWERED_SECONDS)
        )
        if lower != self._lowered:
            self._lowered = lower
            self._lower(lower)
        if not self._reading or share <= 0 or (lower and share >= 1):
            return
        # Look again when the budget is spent, or has grown back enough to lower again.
        delay = left / (1 - share) if lower else (self.MIN_LOWERED_SECONDS - left) / share
        call_later = self._call_later or asyncio.get_running_loop().call_later
        self._timer = call_later(max(delay, 0.0), self._look_again)
