"""The lifecycle without I/O: transitions and the capped, jittered backoff."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from controlroom.notifications.lifecycle import (
    Attempt,
    Policy,
    Status,
    Verdict,
    after_attempt,
    backoff,
    error_text,
)
from controlroom.telemetry.widths import LAST_ERROR_WIDTH

NOW = datetime(2026, 12, 4, 8, 0, tzinfo=UTC)
POLICY = Policy(max_attempts=3, base=10.0, cap=900.0, retry_after_cap=3600.0)


def test_backoff_grows_exponentially_up_to_the_cap_with_jitter_below_the_ceiling() -> None:
    rng = random.Random(7)
    for failures, ceiling in ((1, 10), (2, 20), (3, 40), (7, 640), (8, 900), (60, 900)):
        waits = [backoff(failures, base=10, cap=900, rng=rng) for _ in range(200)]
        assert all(ceiling / 2 <= wait <= ceiling for wait in waits)
        assert len(set(waits)) > 1  # jittered


def test_backoff_refuses_zero_failures() -> None:
    with pytest.raises(ValueError):
        backoff(0, base=10, cap=900, rng=random.Random())


def test_a_failure_below_max_attempts_retries_after_the_backoff() -> None:
    after = after_attempt(0, Attempt(Verdict.RETRY, "HTTP 500"), NOW, POLICY, random.Random(1))
    assert after.status is Status.RETRYING and after.retry_count == 1
    assert after.next_attempt_at is not None
    assert NOW + timedelta(seconds=5) <= after.next_attempt_at <= NOW + timedelta(seconds=10)
    assert after.terminal_at is None


def test_the_last_allowed_failure_parks_it() -> None:
    after = after_attempt(2, Attempt(Verdict.RETRY, "HTTP 500"), NOW, POLICY, random.Random(1))
    assert (after.status, after.retry_count, after.next_attempt_at) == (Status.PARKED, 3, None)


@pytest.mark.parametrize(
    ("verdict", "status", "terminal"),
    [
        (Verdict.DELIVERED, Status.DELIVERED, True),
        (Verdict.PERMANENT, Status.FAILED, True),
        (Verdict.PARK, Status.PARKED, False),
        (Verdict.CONFIGURATION, Status.PARKED, False),
    ],
)
def test_verdicts_that_end_the_retries(verdict: Verdict, status: Status, terminal: bool) -> None:
    after = after_attempt(0, Attempt(verdict), NOW, POLICY, random.Random(1))
    assert after.status is status
    assert after.next_attempt_at is None
    assert (after.terminal_at == NOW) is terminal


def test_retry_after_replaces_the_backoff_and_is_capped() -> None:
    rng = random.Random(1)
    soon = after_attempt(0, Attempt(Verdict.RETRY, retry_after=120), NOW, POLICY, rng)
    assert soon.next_attempt_at == NOW + timedelta(seconds=120)
    late = after_attempt(0, Attempt(Verdict.RETRY, retry_after=10**9), NOW, POLICY, rng)
    assert late.next_attempt_at == NOW + timedelta(seconds=3600)


def test_an_error_of_our_own_making_fits_its_column_saying_what_was_left_out() -> None:
    assert error_text("short") == "short"
    long = error_text("x" * 5000)
    assert len(long) <= LAST_ERROR_WIDTH and long.endswith("characters left out)")
