"""The reconciliation cursor's pure rules: advancing, the id tiebreak, the pinned latch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from controlroom.sitecalls.cursor import PinChange, judge_page, pin_change

T = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_the_cursor_advances_to_the_greatest_pair_seen() -> None:
    verdict = judge_page(None, [(T, "b"), (T, "a")], more_available=True)
    assert (verdict.cursor, verdict.advanced, verdict.stuck) == ((T, "b"), True, False)
    later = judge_page((T, "b"), [(T, "c"), (T + timedelta(seconds=1), "a")], False)
    assert later.cursor == (T + timedelta(seconds=1), "a")


def test_a_page_at_or_before_the_cursor_with_more_available_is_stuck() -> None:
    # A legacy site answering the same inclusive page again.
    verdict = judge_page((T, "z"), [(T, "a"), (T, "z")], more_available=True)
    assert (verdict.cursor, verdict.advanced, verdict.stuck) == ((T, "z"), False, True)
    assert not judge_page((T, "z"), [], more_available=False).stuck


@given(st.lists(st.tuples(st.integers(0, 3), st.text("abc", min_size=1, max_size=2))))
def test_the_cursor_never_moves_back(keys: list[tuple[int, str]]) -> None:
    cursor = (T + timedelta(seconds=2), "b")
    pairs = [(T + timedelta(seconds=s), i) for s, i in keys]
    verdict = judge_page(cursor, pairs, more_available=False)
    assert verdict.cursor >= cursor
    assert verdict.advanced == any(pair > cursor for pair in pairs)


def test_the_latch_changes_once_each_way() -> None:
    assert pin_change(False, stuck=True, progressed=False) is PinChange.LATCHED
    assert pin_change(True, stuck=True, progressed=False) is None  # no second event
    assert pin_change(True, stuck=True, progressed=True) is None  # moved, stuck again
    assert pin_change(True, stuck=False, progressed=True) is PinChange.CLEARED
    assert pin_change(False, stuck=False, progressed=True) is None
    assert pin_change(True, stuck=False, progressed=False) is None
