"""``runtime.intake_health``: the rules of a stuck intake, on a clock the test turns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controlroom.runtime.intake_health import IntakeHealth


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def intake(clock: Clock) -> IntakeHealth:
    return IntakeHealth("unit intake", "error", stall_seconds=60, monotonic=clock)


def test_messages_waiting_past_the_stall_time_without_a_store_degrade_it() -> None:
    clock = Clock()
    health = intake(clock)
    health.observed_depth(178)
    clock.now += 59
    assert not health.state().degraded  # a queue seen for less than the stall time
    clock.now += 2
    reason = health.state().reason
    assert reason == "unit intake: nothing stored for 61 s although error holds 178 messages"


def test_a_store_restarts_the_stall_clock_and_an_empty_queue_stops_it() -> None:
    clock = Clock()
    health = intake(clock)
    health.observed_depth(5)
    clock.now += 50
    health.stored()
    clock.now += 50
    assert not health.state().degraded  # 50 s since the last store
    clock.now += 20
    assert health.state().degraded
    health.observed_depth(0)
    assert not health.state().degraded
    clock.now += 1000
    assert not health.state().degraded  # nothing waits: nothing to store


def test_a_failed_write_degrades_it_until_a_store_succeeds() -> None:
    clock = Clock()
    health = intake(clock)
    health.failed("OperationalError [SQLITE_FULL]")
    health.failed("OperationalError [SQLITE_FULL]")
    state = health.state()
    assert state.degraded and state.write_failures == 2
    assert state.reason is not None and "(2 attempts; last: OperationalError [SQLITE_FULL])" in (
        state.reason
    )
    health.stored()
    assert not health.state().degraded and health.state().write_failures == 0


def test_a_worker_that_ends_in_a_loop_degrades_it_from_its_first_end_until_one_runs() -> None:
    wall = [datetime(2026, 12, 6, 11, 0, tzinfo=UTC)]
    health = IntakeHealth("unit intake", "error", stall_seconds=60, clock=lambda: wall[0])
    health.worker_ended(0, "intake worker 0 ended (exit code 1)")
    wall[0] += timedelta(seconds=30)
    health.worker_ended(0, "intake worker 0 ended (exit code 1)")
    health.stored()  # another worker's batch: worker 0 still fails
    state = health.state()
    assert state.reason == (
        "unit intake: intake worker 0 ended (exit code 1) at 2026-12-06T11:00:00+00:00 and "
        "is being started again; the messages stay in error"
    )
    assert state.since == datetime(2026, 12, 6, 11, 0, tzinfo=UTC)
    health.worker_running(0)
    assert not health.state().degraded


def test_a_stall_never_reported_is_kept_until_reported_with_its_start() -> None:
    clock = Clock()
    wall = [datetime(2026, 12, 4, 8, 0, tzinfo=UTC)]
    health = IntakeHealth(
        "unit intake", "error", stall_seconds=60, monotonic=clock, clock=lambda: wall[0]
    )
    health.failed("OperationalError: database or disk is full")
    first = health.transition()
    assert first is not None and first.degraded and first.since == wall[0]
    # Its write was refused (never ``reported``); the next round sees it still degraded.
    wall[0] += timedelta(minutes=1)
    assert health.transition() is not None
    assert health.unreported_stall() is first  # the first seen, not the latest
    wall[0] += timedelta(minutes=9)
    health.stored()
    recovered = health.transition()
    assert recovered is not None and not recovered.degraded  # healthy, yet a change
    missed = health.unreported_stall()
    assert missed is first and missed.observed_at == datetime(2026, 12, 4, 8, 0, tzinfo=UTC)
    health.reported(recovered)
    assert health.transition() is None and health.unreported_stall() is None


def test_a_reported_stall_leaves_nothing_unreported() -> None:
    clock = Clock()
    health = intake(clock)
    health.failed("disk full")
    stalled = health.transition()
    assert stalled is not None
    health.reported(stalled)
    health.stored()
    recovered = health.transition()
    assert recovered is not None and not recovered.degraded
    assert health.unreported_stall() is None
