"""A receiver's ``Retry-After`` (docs/design.md "Notification channels"): delay seconds
in ASCII digits or an HTTP date; anything else is nonsense and ignored (the backoff
applies); a huge one is capped by ``retry_after_cap``."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from controlroom.notifications.channels import http_verdict, retry_after_seconds
from controlroom.notifications.lifecycle import Policy, Status, after_attempt

NOW = datetime(2026, 12, 4, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("120", 120.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("Fri, 04 Dec 2026 08:01:30 GMT", 90.0),
        ("Fri, 04 Dec 2026 07:00:00 GMT", 0.0),  # a date passed: at once
    ],
)
def test_seconds_and_http_dates_are_read(header: str, seconds: float) -> None:
    assert retry_after_seconds(header, NOW) == seconds


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "soon",
        "-5",  # a delay is never negative
        "1.5",
        "+3",
        "²",  # str.isdigit() says yes, float() refuses it
        "١٢",  # Arabic-Indic digits: float() reads them, HTTP does not
        "\uff11\uff12",  # fullwidth digits
        "12 seconds",
        "Fri, 04 Dec 2026 08:01:30",  # no zone
    ],
)
def test_nonsense_is_ignored(header: str | None) -> None:
    assert retry_after_seconds(header, NOW) is None


def test_a_huge_delay_is_capped_by_the_setting() -> None:
    policy = Policy(max_attempts=10, base=10.0, cap=900.0, retry_after_cap=3600.0)
    for header in ("9" * 30, "9" * 5000, "Fri, 31 Dec 9999 23:59:59 GMT"):
        attempt = http_verdict(429, header, NOW)
        assert attempt.retry_after is not None and attempt.retry_after > 3600
        after = after_attempt(0, attempt, NOW, policy, random.Random(1))
        assert after.status is Status.RETRYING
        assert after.next_attempt_at == NOW + timedelta(seconds=3600)
