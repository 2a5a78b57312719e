"""Reads first: serve counts the reads it is answering in memory its workers share, and a
worker's store statements wait while any is in flight, for at most a share of the time
(docs/design.md "Process shape", "Reads first")."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from typing import Any

import pytest
import sqlalchemy as sa

from controlroom.runtime.reads_first import CountReads, ReadsInFlight, WeighIntake, YieldToReads
from controlroom.workers import yield_to_reads


class _Clock:
    """A clock that moves only when the gate sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.now > 2000.0:  # a gate that never stops waiting fails, not hangs
            raise AssertionError("the gate waited without end")


def _reads() -> ReadsInFlight:
    return ReadsInFlight.shared(multiprocessing.get_context("spawn"))


@pytest.mark.parametrize(("method", "counted"), [("GET", 1), ("HEAD", 1), ("POST", 0)])
def test_a_read_is_counted_while_serve_answers_it_and_a_write_is_not(
    method: str, counted: int
) -> None:
    reads = _reads()
    seen: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(reads.count)

    asyncio.run(CountReads(app, reads)({"type": "http", "method": method}, None, None))

    assert seen == [counted]
    assert reads.count == 0


@pytest.mark.parametrize("path", ["/api/health", "/metrics"])
def test_a_probe_is_not_counted_as_a_read(path: str) -> None:
    """Fresh user's pass (session 31): a supervisor's health checks and Prometheus's
    scrapes made intake wait and lowered its weight as an operator's reads do."""
    reads = _reads()
    heard: list[bool] = []
    seen: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(reads.count)

    counting = CountReads(app, reads, on_reading=heard.append)
    asyncio.run(counting({"type": "http", "method": "GET", "path": path}, None, None))

    assert seen == [0]
    assert heard == []


def test_a_read_that_fails_is_no_longer_counted() -> None:
    reads = _reads()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("the route failed")

    with pytest.raises(RuntimeError):
        asyncio.run(CountReads(app, reads)({"type": "http", "method": "GET"}, None, None))

    assert reads.count == 0


def test_the_first_read_lowers_intake_and_the_last_raises_it_again() -> None:
    """``on_reading`` hears True when reads in flight go from none to one, False when they
    go back to none; overlapping reads, a write and a failed read change nothing more
    (docs/decisions.md "Intake's weight follows the reads")."""
    reads = _reads()
    heard: list[bool] = []
    first_in = asyncio.Event()
    release = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/slow":
            first_in.set()
            await release.wait()
        elif scope["path"] == "/fails":
            raise RuntimeError("the route failed")

    counted = CountReads(app, reads, on_reading=heard.append)

    async def requests() -> None:
        slow = asyncio.create_task(
            counted({"type": "http", "method": "GET", "path": "/slow"}, None, None)
        )
        await first_in.wait()
        await counted({"type": "http", "method": "GET", "path": "/"}, None, None)
        await counted({"type": "http", "method": "POST", "path": "/"}, None, None)
        with pytest.raises(RuntimeError):
            await counted({"type": "http", "method": "GET", "path": "/fails"}, None, None)
        assert heard == [True]
        release.set()
        await slow
        with pytest.raises(RuntimeError):
            await counted({"type": "http", "method": "HEAD", "path": "/fails"}, None, None)

    asyncio.run(requests())
    assert heard == [True, False, True, False]
    assert reads.count == 0


def test_without_a_read_in_flight_the_worker_does_not_wait() -> None:
    clock = _Clock()
    gate = YieldToReads(_reads(), share=0.2, clock=clock, sleep=clock.sleep)

    gate.wait()

    assert clock.now == 1000.0


def test_the_worker_waits_until_the_read_is_answered() -> None:
    clock = _Clock()
    reads = _reads()
    reads.add(1)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 1000.05:
            reads.add(-1)  # the read is answered 50 ms later

    gate = YieldToReads(reads, share=0.2, clock=clock, sleep=sleep)

    gate.wait()

    assert 1000.05 <= clock.now < 1000.06
    assert gate.waited_seconds == pytest.approx(clock.now - 1000.0)


def test_the_workers_stop_ends_its_wait_and_every_later_one() -> None:
    clock = _Clock()
    reads = _reads()
    reads.add(1)  # a read that never ends
    gate: YieldToReads

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 1010.0:
            gate.stop_waiting()  # the worker's SIGTERM, 10 s into the wait

    gate = YieldToReads(reads, share=1.0, clock=clock, sleep=sleep)

    gate.wait()
    assert 1010.0 <= clock.now < 1010.01
    assert gate.idle
    gate.wait()
    assert clock.now < 1010.01


def test_a_read_that_never_ends_takes_at_most_its_share_of_the_workers_time() -> None:
    clock = _Clock()
    reads = _reads()
    reads.add(1)
    gate = YieldToReads(reads, share=0.2, clock=clock, sleep=clock.sleep)
    worked = 0.0

    for _ in range(2000):  # statements of 10 ms each, 20 s of the worker's own work
        gate.wait()
        clock.now += 0.01
        worked += 0.01

    elapsed = clock.now - 1000.0
    assert gate.waited_seconds <= 0.2 * elapsed + YieldToReads.BURST_SECONDS
    assert gate.waited_seconds >= 0.2 * elapsed - YieldToReads.BURST_SECONDS  # it did yield
    assert worked == pytest.approx(elapsed - gate.waited_seconds)


def test_share_zero_never_waits() -> None:
    clock = _Clock()
    reads = _reads()
    reads.add(1)
    gate = YieldToReads(reads, share=0.0, clock=clock, sleep=clock.sleep)

    gate.wait()

    assert clock.now == 1000.0


def test_a_workers_statement_does_not_run_while_serve_answers_a_read() -> None:
    reads = _reads()
    reads.add(1)
    frozen = _Clock()  # the budget never runs out: only the read's end lets it through
    gate = YieldToReads(reads, share=0.5, clock=frozen)
    engine = sa.create_engine("sqlite://")
    yield_to_reads(engine, gate)
    ran = threading.Event()
    sa.event.listen(engine, "after_cursor_execute", lambda *_: ran.set())

    def statement() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    worker = threading.Thread(target=statement)
    worker.start()
    assert gate.waiting.wait(timeout=30)

    assert not ran.is_set()
    reads.add(-1)
    worker.join(timeout=30)
    assert ran.is_set()


def test_a_statement_on_the_event_loops_thread_does_not_wait() -> None:
    reads = _reads()
    reads.add(1)
    gate = YieldToReads(reads, share=0.5, clock=_Clock())  # would wait for ever
    engine = sa.create_engine("sqlite://")
    yield_to_reads(engine, gate)

    async def on_the_loop() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    ended = threading.Event()
    threading.Thread(target=lambda: (asyncio.run(on_the_loop()), ended.set()), daemon=True).start()

    assert ended.wait(timeout=30)


def test_statements_waiting_at_once_spend_the_workers_time_once() -> None:
    """With ``share`` 1 the worker waits as long as the read lasts, however many of its
    threads wait together (a budget spent per thread ran out, and let them through)."""
    clock = _Clock()
    reads = _reads()
    reads.add(1)
    gate = YieldToReads(reads, share=1.0, clock=clock, sleep=clock.sleep)
    ran: list[int] = []

    def statement(n: int) -> None:
        gate.wait()
        ran.append(n)

    threads = [threading.Thread(target=statement, args=(n,), daemon=True) for n in range(3)]
    for thread in threads:
        thread.start()
    while clock.now < 1001.0 and not ran:  # a second of the worker's time, three waiting
        threading.Event().wait(0.001)

    assert ran == []
    reads.add(-1)
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(ran) == [0, 1, 2]


class _Timers:
    """``loop.call_later`` on a ``_Clock``: ``run_until`` fires what falls due, in order."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.pending: list[asyncio.TimerHandle] = []

    def call_later(self, delay: float, callback: Any) -> asyncio.TimerHandle:
        handle = asyncio.TimerHandle(self.clock.now + delay, callback, (), _NoLoop())
        self.pending.append(handle)
        return handle

    def run_until(self, until: float) -> None:
        while due := sorted(
            (h for h in self.pending if not h.cancelled() and h.when() <= until),
            key=lambda h: h.when(),
        ):
            handle = due[0]
            self.pending.remove(handle)
            self.clock.now = max(self.clock.now, handle.when())
            handle._run()
        self.clock.now = until


class _NoLoop:
    """What a ``TimerHandle`` asks of its loop when cancelled or run outside one."""

    def get_debug(self) -> bool:
        return False

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        pass


def _lowered_seconds(heard: list[tuple[float, bool]], until: float) -> float:
    """Seconds between each ``True`` heard and the ``False`` after it (or ``until``)."""
    total, since = 0.0, None
    for at, lowered in heard:
        if lowered and since is None:
            since = at
        elif not lowered and since is not None:
            total, since = total + at - since, None
    return total + (until - since if since is not None else 0.0)


def _weigh(share: float) -> tuple[WeighIntake, list[tuple[float, bool]], _Timers]:
    clock = _Clock()
    timers = _Timers(clock)
    heard: list[tuple[float, bool]] = []
    weigh = WeighIntake(
        lambda lowered: heard.append((clock.now, lowered)),
        share=share,
        clock=clock,
        call_later=timers.call_later,
    )
    return weigh, heard, timers


def test_a_read_that_never_ends_lowers_intake_for_at_most_its_share_of_the_time() -> None:
    """The weight drops for reads within the share ``yield_to_reads`` gives them, so a
    reader that never stops leaves the drain the rest of its pace on a busy machine too
    (docs/decisions.md "Intake's weight follows the reads")."""
    weigh, heard, timers = _weigh(0.2)
    weigh.reading(True)
    timers.run_until(1100.0)
    lowered = _lowered_seconds(heard, 1100.0)
    assert 0.2 * 100 - 1 <= lowered <= 0.2 * 100 + WeighIntake.BURST_SECONDS
    assert len(heard) > 20  # lowered again and again, not once for the share in one piece
    weigh.reading(False)
    timers.run_until(1200.0)  # nothing lowers it once the reads are over
    assert heard[-1][1] is False
    assert heard[-1][0] <= 1100.0


def test_the_seconds_of_reads_and_of_the_lowered_weight_are_counted() -> None:
    """``/metrics`` shows how much of the reads' time the weight was down for them
    (docs/decisions.md "Intake's weight follows the reads")."""
    weigh, heard, timers = _weigh(0.2)
    timers.run_until(1010.0)  # no read: nothing counted
    weigh.reading(True)
    timers.run_until(1110.0)
    weigh.reading(False)
    timers.run_until(1200.0)
    assert weigh.reading_seconds == pytest.approx(100.0)
    assert weigh.lowered_seconds == pytest.approx(_lowered_seconds(heard, 1200.0))
    assert 0.2 * 100 - 1 <= weigh.lowered_seconds <= 0.2 * 100 + WeighIntake.BURST_SECONDS


def test_reads_within_the_share_lower_intake_while_each_lasts() -> None:
    weigh, heard, timers = _weigh(0.2)
    for second in range(10):
        timers.run_until(1000.0 + second)
        weigh.reading(True)
        timers.run_until(1000.0 + second + 0.05)
        weigh.reading(False)
    assert heard == [
        (1000.0 + second + offset, lowered)
        for second in range(10)
        for offset, lowered in ((0.0, True), (0.05, False))
    ]


def test_a_share_of_zero_never_lowers_intake() -> None:
    weigh, heard, timers = _weigh(0.0)
    weigh.reading(True)
    timers.run_until(1010.0)
    weigh.reading(False)
    assert heard == []
