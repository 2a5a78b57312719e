"""The periodic-task helper (``runtime/periodic.py``) against a lease that records calls."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import REGISTRY

from controlroom.runtime.periodic import PeriodicTask

TIMEOUT = 10.0


class RecordingLease:
    """A lease in memory: records ``hold``/``release`` in ``events``."""

    def __init__(self, *, granted: bool = True) -> None:
        self.name = "test-lease"
        self.granted = granted
        self.events: list[str] = []

    def hold(self) -> bool:
        self.events.append("hold")
        return self.granted

    def release(self) -> None:
        self.events.append("release")


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition()``; fails naming ``what`` after ``TIMEOUT`` seconds."""
    try:
        async with asyncio.timeout(TIMEOUT):
            while not condition():
                await asyncio.sleep(0.005)
    except TimeoutError:
        pytest.fail(f"no {what} within {TIMEOUT} s")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def periodic_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[logging.LogRecord]]:
    """The periodic helper's warnings, caught on its own logger: another test of the same
    worker may have reconfigured the root logger (where caplog listens) or disabled
    loggers that existed then."""
    logger = logging.getLogger("controlroom.runtime.periodic")
    monkeypatch.setattr(logger, "disabled", False)
    handler = _Records()
    logger.addHandler(handler)
    yield handler.records
    logger.removeHandler(handler)


def test_a_failure_is_logged_and_the_schedule_goes_on(
    periodic_log: list[logging.LogRecord],
) -> None:
    runs: list[int] = []

    def work() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise RuntimeError("the store is away")

    async def main() -> None:
        task = asyncio.create_task(PeriodicTask("flaky", work, interval=0.01).run())
        await until(lambda: len(runs) >= 3, "three runs")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    failures = [r for r in periodic_log if "flaky failed; next run in" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].exc_info is not None and "the store is away" in str(failures[0].exc_info[1])


def test_without_the_lease_the_work_does_not_run_and_the_lease_is_released_at_the_end() -> None:
    lease = RecordingLease(granted=False)
    runs: list[None] = []

    async def main() -> None:
        periodic = PeriodicTask("unleased", lambda: runs.append(None), interval=0.01, lease=lease)
        task = asyncio.create_task(periodic.run())
        await until(lambda: lease.events.count("hold") >= 3, "three tries")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert runs == []
    assert lease.events[-1] == "release"


@pytest.mark.parametrize("kind", ["thread", "coroutine"])
def test_cancellation_waits_for_the_running_work_before_releasing_the_lease(kind: str) -> None:
    """The work outlives the cancellation by a while; the lease is released after it."""
    lease = RecordingLease()
    started = threading.Event()

    def blocking() -> None:
        started.set()
        time.sleep(0.3)
        lease.events.append("work ended")

    async def coroutine() -> None:
        started.set()
        await asyncio.to_thread(time.sleep, 0.3)  # a thread inside async work
        lease.events.append("work ended")

    async def main() -> None:
        work = blocking if kind == "thread" else coroutine
        task = asyncio.create_task(PeriodicTask("slow", work, interval=60, lease=lease).run())
        await asyncio.to_thread(started.wait, TIMEOUT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert lease.events == ["hold", "work ended", "release"]


def test_cancellation_sets_stopping_so_long_work_can_end_early() -> None:
    periodic: PeriodicTask
    seen: list[bool] = []

    def work() -> None:
        deadline = time.monotonic() + TIMEOUT
        while not periodic.stopping.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)
        seen.append(periodic.stopping.is_set())

    async def main() -> None:
        task = asyncio.create_task(periodic.run())
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    periodic = PeriodicTask("long", work, interval=60)
    asyncio.run(main())
    assert seen == [True]


def test_wake_starts_the_next_run_at_once() -> None:
    runs: list[float] = []

    async def main() -> None:
        periodic = PeriodicTask("sleepy", lambda: runs.append(time.monotonic()), interval=60)
        task = asyncio.create_task(periodic.run())
        await until(lambda: len(runs) == 1, "the first run")
        periodic.wake()
        await until(lambda: len(runs) == 2, "a run on wake")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert runs[1] - runs[0] < 5


def test_a_success_sets_the_last_success_time_of_its_task() -> None:
    before = time.time()

    async def main() -> None:
        ran = asyncio.Event()
        task = asyncio.create_task(PeriodicTask("metered", ran.set, interval=60).run())
        await asyncio.wait_for(ran.wait(), TIMEOUT)
        await asyncio.sleep(0.01)  # the gauge is set once the run returned
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    value = REGISTRY.get_sample_value(
        "controlroom_periodic_last_success_timestamp_seconds", {"task": "metered"}
    )
    assert value is not None and before <= value <= time.time()


def test_the_wait_is_jittered_within_its_fraction_and_backs_off_after_failures() -> None:
    jittered = PeriodicTask("j", lambda: None, interval=10, jitter=0.2, rng=random.Random(7))
    delays = [jittered.next_delay() for _ in range(200)]
    assert all(8 <= d <= 12 for d in delays) and max(delays) - min(delays) > 2

    def fail() -> None:
        raise RuntimeError("down")

    backing = PeriodicTask("b", fail, interval=1, max_backoff=5)

    async def fail_times(n: int) -> None:
        for _ in range(n):
            await backing._run_once()

    asyncio.run(fail_times(2))
    assert backing.next_delay() == 4
    asyncio.run(fail_times(3))
    assert backing.next_delay() == 5
    assert PeriodicTask("plain", fail, interval=1).next_delay() == 1


@pytest.mark.parametrize(
    "arguments",
    [
        {"interval": 0},
        {"interval": 1, "max_backoff": 0},
        {"interval": 1, "jitter": 1.0},
        {"interval": 1, "first_delay": -1},
    ],
)
def test_a_schedule_that_makes_no_sense_is_refused(arguments: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PeriodicTask("bad", lambda: None, **arguments)  # type: ignore[arg-type]


def test_a_first_delay_holds_the_first_run_until_it_passes_or_a_wake() -> None:
    runs: list[float] = []

    async def main() -> None:
        periodic = PeriodicTask(
            "late", lambda: runs.append(time.monotonic()), interval=60, first_delay=3600
        )
        task = asyncio.create_task(periodic.run())
        for _ in range(20):  # ready callbacks only: a first run would have started by now
            await asyncio.sleep(0)
        assert runs == []
        periodic.wake()
        await until(lambda: len(runs) == 1, "a run on wake")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
