"""Counts read as English: one of a thing is singular (first-time user's pass)."""

from __future__ import annotations

from controlroom.sitecalls.history import crossing_count
from controlroom.web import charts


def test_a_chart_value_of_one_is_singular() -> None:
    assert charts.format_value(1, "notifications") == "1 notification"
    assert charts.format_value(1, "calls") == "1 call"
    assert charts.format_value(2, "calls") == "2 calls"
    assert charts.format_value(0, "notifications") == "0 notifications"
    assert charts.format_value(1.5, "calls") == "1.5 calls"


def test_a_threshold_crossing_of_one_call_is_singular() -> None:
    assert crossing_count(1, "stuck") == "1 stuck site call"
    assert crossing_count(3, "parked") == "3 parked site calls"


def test_a_charts_title_names_the_interval_and_the_tiles_words() -> None:
    assert charts.title_of("failed_last_interval", charts.SITE_CALLS, "1 h") == (
        "Failed in the last 1 h"
    )
    assert charts.title_of("buffered", charts.NOTIFICATIONS, "1 h") == "To send"
    assert charts.title_of("buffered", charts.SITE_CALLS, None) == "Buffered"
