"""Trend charts of the KPIs (the site calls' and the notification outbox's) as
server-rendered SVG geometry (``_sitecalls.html`` ``trend`` draws it): no JavaScript, every
label plain text (autoescaped by the template).

Source: docs/decisions.md "KPI trends are drawn on the server as SVG" (a trend chart of each
KPI from the KPI history: axes, units, readable time labels). The series comes from
``db.kpi_history.read_series`` of one ``KpiSource``; a scope with no sample at an instant has
nothing to report (read as zero), so the line is drawn through the samples there are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

import sqlalchemy as sa

from controlroom.db.kpi_history import METRICS, SeriesPoint, first_sample_at, read_series

WIDTH: Final = 360
HEIGHT: Final = 160
LEFT: Final = 44  # room for the value labels
RIGHT: Final = 8
TOP: Final = 10
BOTTOM: Final = 26  # room for the time labels
WINDOW: Final = timedelta(hours=24)
MIN_SPAN: Final = timedelta(minutes=5)
"""The shortest time axis: a history younger than this is drawn over the last 5 minutes."""
MAX_POINTS: Final = 144  # one point per 10 minutes over the window

LABELS: Final[dict[str, str]] = {
    "buffered": "Buffered",
    "parked": "Parked",
    "failed_last_interval": "Failed in the last interval",
    "delivered_last_interval": "Delivered in the last interval",
    "oldest_pending_age_seconds": "Oldest pending age",
    "stuck": "Stuck",
}
AGE_METRIC: Final = "oldest_pending_age_seconds"


@dataclass(frozen=True, slots=True)
class KpiSource:
    """Whose KPI history a chart reads: the ``kpi_samples`` source, what it counts (the
    unit of every metric but the age), the prefix of its charts' test ids, and titles
    of its own where its KPI tiles word a figure differently from ``LABELS``."""

    source: str
    noun: str
    prefix: str
    titles: tuple[tuple[str, str], ...] = ()


SITE_CALLS: Final = KpiSource("sitecalls", "calls", "trend-")
NOTIFICATIONS: Final = KpiSource(
    "notifications",
    "notifications",
    "notification-trend-",
    (("buffered", "To send"), ("oldest_pending_age_seconds", "Oldest unsent age")),
)


def title_of(metric: str, source: KpiSource, interval: str | None) -> str:
    """A chart's title in its KPI tile's words: ``Failed in the last 1 h`` (``interval``
    the configured interval as the tiles word it, ``filters.span``; ``the last interval``
    without one), ``To send``."""
    title = dict(source.titles).get(metric, LABELS[metric])
    if interval is not None and metric.endswith("_last_interval"):
        title = title.replace("the last interval", f"the last {interval}")
    return title


@dataclass(frozen=True, slots=True)
class Tick:
    """An axis label at ``position`` (SVG units along its axis)."""

    position: float
    label: str


@dataclass(frozen=True, slots=True)
class TrendChart:
    """One KPI's chart: the polyline's points (SVG units), its axis ticks, and the
    latest value as text. ``points`` is empty when the window has no sample."""

    metric: str
    title: str
    unit: str  # "seconds" for the age, else what the source counts ("calls")
    points: str
    dots: list[tuple[float, float, str]]  # x, y, the sample as text ("12 calls at 09:30 UTC")
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    latest: str
    start: datetime
    end: datetime
    window: str  # "last 24 hours", or "since 09:30" (UTC) for a younger history
    testid: str = ""  # the figure's data-testid: "trend-parked", "notification-trend-parked"

    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right_edge: int = WIDTH - RIGHT
    top: int = TOP
    bottom_edge: int = HEIGHT - BOTTOM


def kpi_charts(
    conn: sa.Connection,
    *,
    now: datetime,
    source: KpiSource = SITE_CALLS,
    interval: str | None = None,
    scope: str = "global",
    scope_key: str = "",
) -> list[TrendChart]:
    """A chart of each KPI (``METRICS`` order) of one scope of ``source`` over the 24
    hours up to ``now``, or from the scope's first sample when that is later
    (docs/decisions.md "A chart spans the history that exists"). The scopes are the
    sampler's: ``global`` (key ``""``), a site call's ``site`` or ``node`` (key
    ``site/node``), a notification's ``channel``."""
    start = now - WINDOW
    first = first_sample_at(conn, source=source.source, scope=scope, scope_key=scope_key)
    if first is not None and first > start:
        start = min(_aware(first), now - MIN_SPAN)
    return [
        build_chart(
            metric,
            read_series(
                conn,
                source=source.source,
                metric=metric,
                scope=scope,
                scope_key=scope_key,
                start=start,
                end=now,
                max_points=MAX_POINTS,
            ),
            start=start,
            end=now,
            source=source,
            interval=interval,
        )
        for metric in METRICS
    ]


def build_chart(
    metric: str,
    series: list[SeriesPoint],
    *,
    start: datetime,
    end: datetime,
    source: KpiSource = SITE_CALLS,
    interval: str | None = None,
) -> TrendChart:
    """The geometry of ``series`` (sorted by time, all in ``[start, end]``), titled as its
    KPI tile (``title_of``). Pure."""
    title = title_of(metric, source, interval)
    unit = "seconds" if metric == AGE_METRIC else source.noun
    largest = max((point.value for point in series), default=0.0)
    # The axis counts in one unit: calls, or seconds, minutes or hours for an age.
    scale, suffix = axis_unit(unit, largest)
    top_value = nice_ceiling(largest / scale) * scale
    span = max((end - start).total_seconds(), 1.0)
    plot_width = WIDTH - RIGHT - LEFT
    plot_height = HEIGHT - BOTTOM - TOP

    def x_of(instant: datetime) -> float:
        return round(LEFT + plot_width * (instant - start).total_seconds() / span, 1)

    def y_of(value: float) -> float:
        return round(TOP + plot_height * (1 - value / top_value), 1)

    dots = [
        (
            x_of(point.captured_at_utc),
            y_of(point.value),
            f"{format_value(point.value, unit)} at {clock(point.captured_at_utc)}",
        )
        for point in series
    ]
    parts = tick_parts(top_value / scale)
    y_ticks = [
        Tick(y_of(top_value * n / parts), f"{_number(top_value / scale * n / parts)}{suffix}")
        for n in range(parts + 1)
    ]
    x_ticks = [
        Tick(x_of(start + (end - start) * n / 4), clock(start + (end - start) * n / 4))
        for n in range(5)
    ]
    latest = (
        f"{format_value(series[-1].value, unit)} at {clock(series[-1].captured_at_utc)}"
        if series
        else "no samples in the last 24 hours"
    )
    window = "last 24 hours" if end - start >= WINDOW else f"since {clock(start)[:5]}"
    return TrendChart(
        metric=metric,
        title=title,
        unit=unit,
        points=" ".join(f"{x},{y}" for x, y, _ in dots),
        dots=dots,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        latest=latest,
        start=start,
        end=end,
        window=window,
        testid=source.prefix + metric,
    )


def nice_ceiling(value: float) -> float:
    """The axis top for a largest value: 1, 2, 2.5 or 5 times a power of ten, at least 1
    (a flat-zero series still gets an axis)."""
    if value <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * power:
            return float(step * power)
    return float(10 * power)  # pragma: no cover - the loop always returns


def axis_unit(unit: str, largest: float) -> tuple[float, str]:
    """The divisor and label suffix of a value axis: counts as they are; an age in
    seconds, minutes or hours by its largest value."""
    if unit != "seconds" or largest < 120:
        return (1.0, " s") if unit == "seconds" else (1.0, "")
    return (60.0, " min") if largest < 7200 else (3600.0, " h")


def tick_parts(top: float) -> int:
    """How many equal steps the axis up to ``top`` (``nice_ceiling``) is cut into, so
    each label is a round number (1 → 0, 1; 2 → 0.5 steps; 5 → 1 steps)."""
    mantissa = top / 10 ** math.floor(math.log10(top))
    return {1.0: 1 if top == 1 else 5, 2.0: 4, 2.5: 5, 5.0: 5}.get(round(mantissa, 3), 4)


def format_value(value: float, unit: str) -> str:
    """``12 calls``, ``1 call`` (``unit`` what is counted, plural); an age as ``95 s``,
    ``1.5 min`` or ``2.0 h``."""
    if unit == "seconds":
        if value < 120:
            return f"{value:.0f} s"
        if value < 7200:
            return f"{value / 60:.1f} min"
        return f"{value / 3600:.1f} h"
    if value == 1 and unit.endswith("s"):
        return f"1 {unit[:-1]}"
    return f"{_number(value)} {unit}"


def _number(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def _aware(instant: datetime) -> datetime:
    """``instant`` as UTC-aware (a store may hand back naive UTC)."""
    return instant if instant.tzinfo is not None else instant.replace(tzinfo=UTC)


def clock(instant: datetime) -> str:
    """``09:30 UTC``: a time label on the axis."""
    return instant.astimezone(UTC).strftime("%H:%M UTC")
