"""The site's pure rules: transitions, backoff, stamps, failure classes, the pull order."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlroom.site import lifecycle
from controlroom.site.lifecycle import Failure, PermanentFailure, Status
from controlroom.telemetry.stamps import Stamp

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
S0 = Stamp.of(T0)


def at(seconds: float) -> Stamp:
    """The stamp ``seconds`` after ``T0``."""
    return Stamp.of(T0 + timedelta(seconds=seconds))


TRANSIENT = Failure(False, "ConnectError: refused", None)


def submitted(stamp: Stamp = S0) -> lifecycle.CallState:
    return lifecycle.submitted(
        tracked_operation_id=str(uuid.uuid4()),
        channel="ApiOutbound",
        target="https://erp.example/invoices",
        source_site="plant-7",
        source_node="node-a",
        stamp=stamp,
    ).state


def fail(state: lifecycle.CallState, failure: Failure, stamp: Stamp, max_retries: int = 3):
    return lifecycle.attempt_failed(
        state, failure, stamp, max_retries=max_retries, backoff_base=1.0, backoff_cap=10.0
    )


def test_transient_failures_are_attempted_again_with_backoff_then_parked() -> None:
    state = submitted()
    first = fail(state, TRANSIENT, at(1))
    assert first.state.status is Status.ATTEMPTED and first.state.retry_count == 1
    assert first.next_attempt_at_utc == T0 + timedelta(seconds=2)
    second = fail(first.state, TRANSIENT, at(3))
    assert second.state.retry_count == 2
    assert second.next_attempt_at_utc == T0 + timedelta(seconds=5)  # 2 s after the 2nd failure
    third = fail(second.state, TRANSIENT, at(6))
    assert third.state.status is Status.PARKED and third.state.retry_count == 3
    assert third.next_attempt_at_utc is None
    assert third.state.terminal_at_utc is None  # Parked awaits an operator


def test_a_permanent_failure_is_terminal_at_once() -> None:
    failed = fail(submitted(), Failure(True, "HTTP 400", 400), at(1))
    assert failed.state.status is Status.FAILED
    assert failed.state.http_status == 400
    assert failed.state.terminal_at_utc == at(1)
    assert failed.next_attempt_at_utc is None


def test_delivered_carries_the_delivering_attempts_http_status_never_an_earlier_ones() -> None:
    # docs/decisions.md "A Delivered call's http_status is its delivering attempt's"
    failed = fail(submitted(), Failure(False, "HTTP 503 from https://erp.example", 503), at(1))
    assert failed.state.http_status == 503
    unknown = lifecycle.delivered(failed.state, at(2))
    assert (unknown.state.status, unknown.state.last_error) == (Status.DELIVERED, None)
    assert unknown.state.http_status is None  # not the failed attempt's 503
    known = lifecycle.delivered(failed.state, at(2), http_status=201)
    assert (known.state.status, known.state.http_status) == (Status.DELIVERED, 201)


def test_backoff_doubles_up_to_the_cap() -> None:
    waits = [lifecycle.backoff_seconds(n, base=1.0, cap=10.0) for n in range(1, 7)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_backoff_stays_at_the_cap_however_many_retries() -> None:
    # max_retries allows 10,000: 2.0 ** 10_000 would overflow a float.
    assert lifecycle.backoff_seconds(10_000, base=1.0, cap=10.0) == 10.0


def _http_error(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://target.example/x")
    return httpx.HTTPStatusError(
        "x", request=request, response=httpx.Response(code, request=request)
    )


@pytest.mark.parametrize(
    ("exc", "permanent", "http_status"),
    [
        (_http_error(400), True, 400),
        (_http_error(404), True, 404),
        (_http_error(408), False, 408),
        (_http_error(429), False, 429),
        (_http_error(503), False, 503),
        (httpx.ConnectError("refused"), False, None),
        (PermanentFailure("duplicate key", http_status=None), True, None),
        (RuntimeError("bug"), False, None),
    ],
)
def test_failure_classes(exc: BaseException, permanent: bool, http_status: int | None) -> None:
    failure = lifecycle.classify_failure(exc)
    assert (failure.permanent, failure.http_status) == (permanent, http_status)


def test_a_long_error_is_bounded_and_marked() -> None:
    failed = fail(submitted(), Failure(False, "x" * 5000, None), at(1))
    assert len(failed.state.last_error) == 1024
    assert failed.state.last_error.endswith("\u2026")
    assert failed.error_detail == "x" * 5000  # the whole text goes to the audit details


def test_operator_retry_starts_a_new_epoch_of_a_parked_call_only() -> None:
    parked = fail(submitted(), TRANSIENT, at(1), max_retries=1).state
    retried = lifecycle.operator_retry(parked, at(2))
    assert retried is not None
    assert (retried.state.status, retried.state.epoch, retried.state.retry_count) == (
        Status.SUBMITTED,
        1,
        0,
    )
    assert retried.next_attempt_at_utc <= T0 + timedelta(seconds=2)  # due at once
    assert lifecycle.operator_retry(retried.state, at(3)) is None
    assert lifecycle.operator_discard(retried.state, at(3)) is None
    discarded = lifecycle.operator_discard(parked, at(3))
    assert discarded is not None and discarded.state.status is Status.DISCARDED
    assert discarded.state.terminal_at_utc == at(3)


def test_a_bad_channel_or_target_is_refused() -> None:
    with pytest.raises(ValueError, match="channel"):
        lifecycle.submitted(
            tracked_operation_id="x",
            channel="Email",
            target="t",
            source_site="s",
            source_node=None,
            stamp=S0,
        )
    with pytest.raises(ValueError, match="target"):
        lifecycle.submitted(
            tracked_operation_id="x",
            channel="DbOutbound",
            target="t" * 257,
            source_site="s",
            source_node=None,
            stamp=S0,
        )


def test_stamps_strictly_increase_even_when_the_clock_stalls_or_goes_back() -> None:
    assert lifecycle.next_stamp(T0, None) == S0
    assert lifecycle.next_stamp(T0, S0) == Stamp(T0, 1)  # 100 ns later
    assert lifecycle.next_stamp(T0 - timedelta(hours=1), S0) == Stamp(T0, 1)
    assert lifecycle.next_stamp(T0, Stamp(T0, 9)) == at(0.000001)  # the next microsecond
    assert lifecycle.next_stamp(T0 + timedelta(seconds=1), S0) == at(1)


# --- the pull order -------------------------------------------------------------------------
# Whole seconds and 100 ns steps: rows share stamps, and microseconds.
stamps = st.one_of(st.integers(0, 3), st.integers(1, 3).map(lambda n: n * 10**7)).map(
    lambda ticks: Stamp.from_ticks(S0.ticks + ticks)
)
states = st.lists(
    st.tuples(stamps, st.uuids().map(str)), min_size=0, max_size=40, unique_by=lambda t: t[1]
).map(
    lambda rows: [
        dataclasses.replace(submitted(stamp), tracked_operation_id=i, updated_at_utc=stamp)
        for stamp, i in rows
    ]
)


@given(states, st.integers(min_value=1, max_value=7))
def test_paging_with_the_composite_cursor_sees_every_row_once(rows, limit) -> None:
    seen: list[str] = []
    page, more = lifecycle.changes_after(rows, None, None, limit)
    while True:
        seen += [row.tracked_operation_id for row in page]
        if not more:
            break
        last = page[-1]
        page, more = lifecycle.changes_after(
            rows, last.updated_at_utc, last.tracked_operation_id, limit
        )
    assert sorted(seen) == sorted(row.tracked_operation_id for row in rows)
    assert len(seen) == len(set(seen))


def test_without_after_id_the_timestamp_is_inclusive() -> None:
    rows = [dataclasses.replace(submitted(S0), tracked_operation_id=f"id-{n}") for n in range(3)]
    page, more = lifecycle.changes_after(rows, S0, None, 10)
    assert len(page) == 3 and not more
    page, _ = lifecycle.changes_after(rows, S0, "id-1", 10)
    assert [row.tracked_operation_id for row in page] == ["id-2"]
