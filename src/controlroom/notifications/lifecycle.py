"""The lifecycle of a notification, without I/O (docs/design.md "Notification outbox").

States: ``Pending`` -> ``Retrying`` -> ``Delivered`` | ``Failed`` (a permanent refusal) |
``Parked`` (after ``max_attempts`` failed attempts, a 410, or a configuration error) ->
``Discarded``, or ``Pending`` again by an operator's Retry. Terminal: Delivered, Failed,
Discarded; Parked awaits an operator and is never purged.

Backoff between attempts is capped exponential with jitter: the ``n``-th failure waits
``min(cap, base * 2**(n-1))`` seconds, scaled by a factor drawn from [0.5, 1] so that
notifications failing together spread their retries. A receiver's ``Retry-After`` (429,
503) replaces the backoff, capped.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from controlroom.telemetry.widths import LAST_ERROR_WIDTH


class Status(enum.StrEnum):
    """A notification's state, as stored and as the API writes it."""

    PENDING = "Pending"
    RETRYING = "Retrying"
    DELIVERED = "Delivered"
    FAILED = "Failed"
    PARKED = "Parked"
    DISCARDED = "Discarded"


DUE: Final = (Status.PENDING, Status.RETRYING)
"""States the dispatcher sends (when their next attempt is due)."""
TERMINAL: Final = (Status.DELIVERED, Status.FAILED, Status.DISCARDED)
"""States the retention purge may remove."""


class Channel(enum.StrEnum):
    """How a notification travels."""

    EMAIL = "Email"
    WEBHOOK = "Webhook"


class Severity(enum.StrEnum):
    """How much a notification matters to its readers."""

    INFO = "Info"
    WARNING = "Warning"
    ERROR = "Error"
    CRITICAL = "Critical"


class Verdict(enum.StrEnum):
    """What one attempt's outcome means for the notification."""

    DELIVERED = "Delivered"
    RETRY = "Retry"
    """A transient failure: try again after the backoff (or the receiver's Retry-After)."""
    PERMANENT = "Permanent"
    """The receiver refused for good (a 4xx other than 408/410/429, an SMTP 5xx, an
    unknown target): Failed."""
    PARK = "Park"
    """Stop trying until an operator says so (410 Gone)."""
    CONFIGURATION = "Configuration"
    """Our side cannot send (TLS or login refused, no SMTP server set): parked, shown to
    the operator, never retried on its own."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """The outcome of one send: its verdict, the error text (``None`` when delivered),
    the receiver's reply code (HTTP status or SMTP reply), a ``Retry-After`` in seconds,
    and, for e-mail, the recipients that have it now (every attempt so far)."""

    verdict: Verdict
    error: str | None = None
    reply_code: int | None = None
    retry_after: float | None = None
    delivered_to: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    """The dispatcher's rules: ``max_attempts`` failed attempts park a notification;
    backoff ``base`` and ``cap`` and the ``retry_after_cap`` are seconds."""

    max_attempts: int
    base: float
    cap: float
    retry_after_cap: float


@dataclass(frozen=True, slots=True)
class Next:
    """A notification's state after an attempt: ``next_attempt_at`` only while due,
    ``terminal_at`` only once terminal."""

    status: Status
    retry_count: int
    next_attempt_at: datetime | None
    terminal_at: datetime | None


def backoff(failures: int, *, base: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait after the ``failures``-th consecutive failure (>= 1): capped
    exponential, jittered down by up to half. Raises ``ValueError`` for ``failures`` < 1."""
    if failures < 1:
        raise ValueError("backoff follows at least one failure")
    ceiling = min(cap, base * (1 << min(failures - 1, 62)))
    return ceiling * rng.uniform(0.5, 1.0)


def after_attempt(
    retry_count: int, attempt: Attempt, now: datetime, policy: Policy, rng: random.Random
) -> Next:
    """The state a notification with ``retry_count`` failed attempts so far takes after
    ``attempt`` ended at ``now`` (module docstring)."""
    if attempt.verdict is Verdict.DELIVERED:
        return Next(Status.DELIVERED, retry_count, None, now)
    failures = retry_count + 1
    if attempt.verdict is Verdict.PERMANENT:
        return Next(Status.FAILED, failures, None, now)
    if attempt.verdict in (Verdict.PARK, Verdict.CONFIGURATION) or failures >= policy.max_attempts:
        return Next(Status.PARKED, failures, None, None)
    if attempt.retry_after is not None:
        delay = min(max(attempt.retry_after, 0.0), policy.retry_after_cap)
    else:
        delay = backoff(failures, base=policy.base, cap=policy.cap, rng=rng)
    return Next(Status.RETRYING, failures, now + timedelta(seconds=delay), None)


def error_text(message: str) -> str:
    """``message`` as a ``last_error`` (at most ``LAST_ERROR_WIDTH`` characters): an error
    of Controlroom's own making (a receiver's reply, an exception) that is longer ends
    saying how much was left out. Input of callers is refused, never shortened
    (``store.NotificationRejected``); this is a diagnostic, not the notification."""
    if len(message) <= LAST_ERROR_WIDTH:
        return message
    left_out = len(message) - (LAST_ERROR_WIDTH - 40)
    return f"{message[: LAST_ERROR_WIDTH - 40]}... ({left_out} characters left out)"
