"""The stamp type (pure): read to 100 ns as sent, ordered by the tick too, written in the
.NET round-trip format (docs/design.md "Stamps")."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlroom.telemetry.stamps import Stamp, round_trip

TICKS = st.integers(0, Stamp.parse("9999-12-31T23:59:59.9999999Z").ticks)


def test_seven_digits_are_kept_and_six_or_fewer_read_as_before() -> None:
    stamp = Stamp.parse("2026-01-01T09:30:00.1234569+01:00")
    assert (stamp.instant, stamp.tick) == (datetime(2026, 1, 1, 8, 30, 0, 123456, UTC), 9)
    assert Stamp.parse("2026-01-01T08:30:00.12Z") == Stamp(
        datetime(2026, 1, 1, 8, 30, 0, 120000, UTC)
    )
    assert Stamp.parse("2026-01-01T08:30:00Z").tick == 0
    assert Stamp.parse("20260101T083000,1234569Z") == stamp


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("2026-01-01T08:30:00.12345691Z", "7 fractional digits"),
        ("2026-01-01T08:30:00.1234569", "with a zone"),
        ("yesterday", "ISO 8601"),
        ("9999-12-31T23:59:59-01:00", "years 1 to 9999"),
    ],
)
def test_what_is_refused(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Stamp.parse(text)


def test_100_ns_apart_is_apart() -> None:
    older = Stamp.parse("2026-01-01T08:30:00.1234568Z")
    newer = Stamp.parse("2026-01-01T08:30:00.1234569Z")
    assert older < newer and older.next() == newer and older != newer
    assert newer.next() == Stamp.parse("2026-01-01T08:30:00.1234570Z")


@given(TICKS, TICKS)
def test_order_and_text_round_trip(a: int, b: int) -> None:
    first, second = Stamp.from_ticks(a), Stamp.from_ticks(b)
    assert Stamp.parse(first.isoformat()) == first and first.ticks == a
    assert (first < second) == (a < b)
    assert (first.isoformat() < second.isoformat()) == (a < b) or first.instant.year < 1000


def test_round_trip_format_always_has_seven_digits() -> None:
    assert round_trip(datetime(2026, 1, 1, 8, 30, tzinfo=UTC)) == "2026-01-01T08:30:00.0000000Z"
    assert str(Stamp(datetime(2026, 1, 1, 8, 30, 0, 5, UTC), 3)) == "2026-01-01T08:30:00.0000053Z"


@pytest.mark.parametrize("text", ["0000-01-01T00:00:00Z", "10000-01-01T00:00:00Z"])
def test_a_year_outside_1_to_9999_is_named_as_such(text: str) -> None:
    # Python's datetime cannot hold it, so it does not parse: the refusal must say why
    # a value that has its zone is refused.
    with pytest.raises(ValueError, match="years 1-9999"):
        Stamp.parse(text)
