"""The site's rules for one cached call, as pure functions: no I/O, no clock of their own.

Source: docs/design.md "The site agent" and "Site call audit". A cached call is
``Submitted`` when recorded, then each attempt ends it:

- success: ``Delivered`` (terminal; ``http_status`` the delivering answer's, or null);
- a permanent failure (an HTTP 4xx other than 408, 425 and 429, or ``PermanentFailure``):
  ``Failed`` (terminal; a permanent failure would fail again);
- a transient failure (anything else): ``Attempted`` with ``retry_count`` + 1 and the
  next attempt after ``backoff_seconds``; ``Parked`` once ``retry_count`` reaches
  ``max_retries`` (non-terminal: it awaits an operator).

An operator acts on a ``Parked`` call only: Retry starts a new lifecycle (``epoch`` + 1,
``Submitted``, ``retry_count`` 0), Discard ends it (``Discarded``, terminal).

Every state carries ``updated_at_utc``; the store stamps each transition with
``next_stamp`` so stamps strictly increase across the whole store, in commit order, which
is what makes the pull contract's keyset cursor (``changes_after``) miss nothing. Stamps
are ``telemetry.stamps.Stamp``s, to 100 ns: transitions within one microsecond of the
clock take its next 100 ns ticks, as a .NET ``datetime2`` site would stamp them.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx

from controlroom.telemetry.contract import check_target
from controlroom.telemetry.ordering import Channel
from controlroom.telemetry.stamps import Stamp
from controlroom.telemetry.widths import LAST_ERROR_WIDTH

CHANNELS = tuple(channel.value for channel in Channel)
_TRANSIENT_HTTP = frozenset({408, 425, 429})


class Status(enum.StrEnum):
    """The statuses a site reports (docs/design.md ``site_calls.status``)."""

    SUBMITTED = "Submitted"
    ATTEMPTED = "Attempted"
    PARKED = "Parked"
    DELIVERED = "Delivered"
    FAILED = "Failed"
    DISCARDED = "Discarded"


DUE_STATUSES = (Status.SUBMITTED, Status.ATTEMPTED)
"""Statuses whose call the engine still attempts on its own."""


class PermanentFailure(Exception):
    """Raised by an operation whose call can never succeed as sent (a rejected request):
    the call ends ``Failed`` and is not retried. ``http_status`` is kept when known."""

    def __init__(self, message: str, *, http_status: int | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status


@dataclass(frozen=True, slots=True)
class Failure:
    """What an attempt's exception means: ``permanent`` or not, with what to report."""

    permanent: bool
    error: str
    http_status: int | None


def classify_failure(exc: BaseException) -> Failure:
    """Permanent for ``PermanentFailure`` and an HTTP answer 4xx other than 408, 425, 429;
    transient for everything else (5xx, connection errors, timeouts, any other exception:
    a bug in an operation parks the call for an operator rather than losing it)."""
    error = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, PermanentFailure):
        return Failure(True, error, exc.http_status)
    if isinstance(exc, httpx.HTTPStatusError):
        code = exc.response.status_code
        permanent = 400 <= code < 500 and code not in _TRANSIENT_HTTP
        return Failure(permanent, f"HTTP {code} from {exc.request.url}", code)
    return Failure(False, error, None)


def bounded_error(error: str) -> str:
    """``error`` shortened to ``LAST_ERROR_WIDTH`` characters, the cut marked with an
    ellipsis (central refuses a longer ``last_error``; the whole text travels in the audit
    event's ``details_json``)."""
    if len(error) <= LAST_ERROR_WIDTH:
        return error
    return error[: LAST_ERROR_WIDTH - 1] + "\u2026"


def backoff_seconds(retry_count: int, *, base: float, cap: float) -> float:
    """Wait before the attempt after the ``retry_count``-th failure: ``base`` doubling
    per failure, at most ``cap`` seconds."""
    wait = base
    for _ in range(max(0, retry_count - 1)):
        if wait >= cap:
            break  # doubling further only risks a float overflow (max_retries is 10,000)
        wait *= 2.0
    return min(cap, wait)


def next_stamp(now: datetime, latest: Stamp | None) -> Stamp:
    """The stamp of a transition: ``now`` (zone-aware), or 100 ns after ``latest`` (the
    newest stamp in the store) when the clock has not moved past it, so stamps strictly
    increase."""
    stamp = Stamp.of(now)
    if latest is not None and stamp <= latest:
        return latest.next()
    return stamp


@dataclass(frozen=True, slots=True)
class CallState:
    """The tracked state of one cached call, as stored and as reported."""

    tracked_operation_id: str
    channel: str
    target: str
    source_site: str
    source_node: str | None
    status: Status
    retry_count: int
    last_error: str | None
    http_status: int | None
    created_at_utc: Stamp
    updated_at_utc: Stamp
    terminal_at_utc: Stamp | None
    epoch: int


@dataclass(frozen=True, slots=True)
class Transition:
    """A new state, the audit action that names it, and when to attempt next (``None``:
    not on its own)."""

    state: CallState
    action: str
    next_attempt_at_utc: datetime | None
    error_detail: str | None = None


def submitted(
    *,
    tracked_operation_id: str,
    channel: str,
    target: str,
    source_site: str,
    source_node: str | None,
    stamp: Stamp,
) -> Transition:
    """The first state of a new cached call. Raises ``ValueError`` for a channel that is
    not ``ApiOutbound``/``DbOutbound`` or a target central's contract refuses
    (``telemetry.contract.check_target``: it would refuse every packet of the call)."""
    if channel not in CHANNELS:
        raise ValueError(f"channel must be one of {', '.join(CHANNELS)}, not {channel!r}")
    check_target(target)
    state = CallState(
        tracked_operation_id=tracked_operation_id,
        channel=channel,
        target=target,
        source_site=source_site,
        source_node=source_node,
        status=Status.SUBMITTED,
        retry_count=0,
        last_error=None,
        http_status=None,
        created_at_utc=stamp,
        updated_at_utc=stamp,
        terminal_at_utc=None,
        epoch=0,
    )
    return Transition(state, "CachedCallSubmitted", stamp.instant)


def delivered(state: CallState, stamp: Stamp, *, http_status: int | None = None) -> Transition:
    """The attempt succeeded. ``http_status`` is the delivering attempt's answer when the
    site knows it, else ``None``: never an earlier, failed attempt's (docs/decisions.md
    "A Delivered call's http_status is its delivering attempt's")."""
    new = dataclasses.replace(
        state,
        status=Status.DELIVERED,
        updated_at_utc=stamp,
        terminal_at_utc=stamp,
        last_error=None,
        http_status=http_status,
    )
    return Transition(new, "CachedCallDelivered", None)


def attempt_failed(
    state: CallState,
    failure: Failure,
    stamp: Stamp,
    *,
    max_retries: int,
    backoff_base: float,
    backoff_cap: float,
) -> Transition:
    """The attempt failed: ``Failed`` when permanent; else ``Attempted`` with the next
    attempt scheduled, or ``Parked`` once ``max_retries`` transient failures are spent."""
    failed = dataclasses.replace(
        state,
        updated_at_utc=stamp,
        last_error=bounded_error(failure.error),
        http_status=failure.http_status,
    )
    if failure.permanent:
        new = dataclasses.replace(failed, status=Status.FAILED, terminal_at_utc=stamp)
        return Transition(new, "CachedCallFailed", None, failure.error)
    retries = state.retry_count + 1
    if retries >= max_retries:
        new = dataclasses.replace(failed, status=Status.PARKED, retry_count=retries)
        return Transition(new, "CachedCallParked", None, failure.error)
    new = dataclasses.replace(failed, status=Status.ATTEMPTED, retry_count=retries)
    wait = backoff_seconds(retries, base=backoff_base, cap=backoff_cap)
    due = stamp.instant + timedelta(seconds=wait)
    return Transition(new, "CachedCallAttempted", due, failure.error)


class CommandOutcome(enum.StrEnum):
    """What a Retry or Discard command did (docs/design.md "Retry/Discard relay")."""

    APPLIED = "Applied"
    NOT_PARKED = "NotParked"
    NOT_FOUND = "NotFound"


def operator_retry(state: CallState, stamp: Stamp) -> Transition | None:
    """A new lifecycle of a Parked call (``epoch`` + 1, ``Submitted``, due at once);
    ``None`` when the call is not Parked."""
    if state.status is not Status.PARKED:
        return None
    new = dataclasses.replace(
        state,
        status=Status.SUBMITTED,
        epoch=state.epoch + 1,
        retry_count=0,
        last_error=None,
        http_status=None,
        updated_at_utc=stamp,
    )
    # Due at once: its creation is an instant every clock reading is past.
    return Transition(new, "CachedCallRetried", state.created_at_utc.instant)


def operator_discard(state: CallState, stamp: Stamp) -> Transition | None:
    """A Parked call given up (``Discarded``, terminal); ``None`` when it is not Parked."""
    if state.status is not Status.PARKED:
        return None
    new = dataclasses.replace(
        state, status=Status.DISCARDED, updated_at_utc=stamp, terminal_at_utc=stamp
    )
    return Transition(new, "CachedCallDiscarded", None)


# --- the pull contract's order ----------------------------------------------------------
Cursor = tuple[Stamp, str]
"""``(updated_at_utc, tracked_operation_id)`` of the last row a puller has seen."""


def is_after(state: CallState, since: Stamp, after_id: str | None) -> bool:
    """True when ``state`` belongs to a pull from ``(since, after_id)``: strictly after
    the pair, or, without ``after_id``, at or after ``since``
    (docs/decisions.md "Pulls are strictly after a composite cursor")."""
    if after_id is None:
        return state.updated_at_utc >= since
    return (state.updated_at_utc, state.tracked_operation_id) > (since, after_id)


def changes_after(
    states: Iterable[CallState], since: Stamp | None, after_id: str | None, limit: int
) -> tuple[list[CallState], bool]:
    """The page of ``states`` a pull from the cursor returns, ordered by
    ``(updated_at_utc, tracked_operation_id)``, and whether more rows follow it. The
    store answers the same with one indexed query; this is its reference."""
    ordered = sorted(states, key=lambda s: (s.updated_at_utc, s.tracked_operation_id))
    if since is not None:
        ordered = [s for s in ordered if is_after(s, since, after_id)]
    return ordered[:limit], len(ordered) > limit
