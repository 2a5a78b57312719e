"""The fold of a batch's attempts (docs/design.md "Writer"), without a database."""

from __future__ import annotations

from controlroom.errors.ingest.fold import fold_attempts, unique_endpoints
from tests.factories import at, attempt, endpoint, message_uuid


def test_winner_is_the_last_attempt_by_time_and_count_is_distinct_timestamps() -> None:
    folded = fold_attempts([attempt(0, at(30)), attempt(0, at(10)), attempt(0, at(30))])

    assert len(folded) == 1
    assert folded[0].winner.time_of_failure == at(30)
    assert folded[0].attempt_count == 2
    assert (folded[0].first_failure_at, folded[0].last_failure_at) == (at(10), at(30))


def test_rows_come_out_sorted_by_unique_message_id() -> None:
    folded = fold_attempts([attempt(n, at(n)) for n in (7, 2, 9, 0)])

    assert [m.unique_message_id for m in folded] == [message_uuid(n) for n in (0, 2, 7, 9)]


def test_same_time_redelivery_keeps_the_one_that_arrived_last() -> None:
    first = attempt(0, at(5), exception_message="first copy")
    second = attempt(0, at(5), exception_message="second copy")

    assert fold_attempts([first, second])[0].winner is second


def test_endpoints_are_deduplicated_and_sorted() -> None:
    endpoints = unique_endpoints([endpoint("b"), endpoint("a"), endpoint("b")])

    assert sorted(e.id for e in endpoints) == [e.id for e in endpoints]
    assert len(endpoints) == 2
