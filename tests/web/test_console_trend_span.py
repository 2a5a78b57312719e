"""docs/decisions.md "A chart spans the history that exists": a young KPI history is drawn
across the chart's whole width, from its first sample, not against the right edge of a
24-hour axis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.sitecalls.history import take_sample
from controlroom.web.charts import LEFT, RIGHT, WIDTH, kpi_charts


def test_half_an_hour_of_samples_spans_the_whole_chart(
    engine: sa.Engine, settings: Settings
) -> None:
    now = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
    for minutes in (30, 20, 10, 0):
        take_sample(engine, settings, now - timedelta(minutes=minutes))
    with engine.connect() as conn:
        charts = {chart.metric: chart for chart in kpi_charts(conn, now=now)}

    buffered = charts["buffered"]
    xs = [x for x, _, _ in buffered.dots]
    assert xs[0] == LEFT
    assert xs[-1] == WIDTH - RIGHT
    assert buffered.start == now - timedelta(minutes=30)
    assert buffered.window == "since 08:30"


def test_a_day_of_samples_keeps_the_24_hour_window(engine: sa.Engine, settings: Settings) -> None:
    now = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
    for hours in (30, 12, 0):
        take_sample(engine, settings, now - timedelta(hours=hours))
    with engine.connect() as conn:
        (buffered, *_) = kpi_charts(conn, now=now)

    assert buffered.start == now - timedelta(hours=24)
    assert buffered.window == "last 24 hours"
    assert [round(x) for x, _, _ in buffered.dots] == [LEFT + (WIDTH - RIGHT - LEFT) // 2, 352]
