"""KPIs at a fixed clock against a hand-computed fixture, globally, per site and per node;
the history sampler and its downsampled series (docs/design.md "KPIs"), on every provider."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.kpi_history import downsample, read_series
from controlroom.sitecalls.history import SOURCE, take_sample
from controlroom.sitecalls.kpis import measure_kpis
from controlroom.sitecalls.writer import SiteCallWriter
from tests.sitecalls.packets import packet, write

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
TEN_MINUTES = timedelta(minutes=10)


def call(
    site: str,
    node: str | None,
    status: str,
    *,
    created_ago: timedelta,
    done_ago: timedelta | None = None,
) -> dict[str, Any]:
    created = NOW - created_ago
    updated = NOW - done_ago if done_ago is not None else created + timedelta(seconds=1)
    data = packet(status, op_id=str(uuid.uuid4()), at=updated, source_site=site, source_node=node)
    data["created_at_utc"] = created.isoformat()
    return data


def fixture(engine: sa.Engine) -> None:
    m = timedelta(minutes=1)
    write(
        SiteCallWriter(engine),
        # site-a / node-1: two buffered (one stuck: created 30 min ago), one parked
        call("site-a", "node-1", "Submitted", created_ago=30 * m),
        call("site-a", "node-1", "Attempted", created_ago=5 * m),
        call("site-a", "node-1", "Parked", created_ago=90 * m),
        # site-a / node-2: one delivered 20 min ago, one failed 2 h ago (outside the hour)
        call("site-a", "node-2", "Delivered", created_ago=25 * m, done_ago=20 * m),
        call("site-a", "node-2", "Failed", created_ago=180 * m, done_ago=120 * m),
        call("site-a", "node-2", "Forwarded", created_ago=12 * m),
        # site-b / node-1: one failed 59 min ago, one delivered exactly an hour ago (out)
        call("site-b", "node-1", "Failed", created_ago=70 * m, done_ago=59 * m),
        call("site-b", "node-1", "Delivered", created_ago=70 * m, done_ago=60 * m),
        call("site-b", "node-1", "Skipped", created_ago=2 * m),
        # a discarded call is terminal but neither delivered nor failed
        call("site-b", "node-1", "Discarded", created_ago=50 * m, done_ago=1 * m),
        # created in the future of NOW's report window does not matter to counts
    )


def kpis(engine: sa.Engine, **scope: str) -> dict[str, Any]:
    with engine.connect() as conn:
        report = measure_kpis(conn, now=NOW, interval=HOUR, stuck_threshold=TEN_MINUTES, **scope)
    return report.total().as_dict(NOW)


def test_kpis_globally_per_site_and_per_node(engine: sa.Engine) -> None:
    fixture(engine)
    assert kpis(engine) == {
        "buffered": 4,
        "parked": 1,
        "failed_last_interval": 1,
        "delivered_last_interval": 1,
        "oldest_pending_age_seconds": 1800.0,
        "stuck": 2,  # Submitted 30 min ago, Forwarded 12 min ago
    }
    assert kpis(engine, site="site-a") == {
        "buffered": 3,
        "parked": 1,
        "failed_last_interval": 0,
        "delivered_last_interval": 1,
        "oldest_pending_age_seconds": 1800.0,
        "stuck": 2,
    }
    assert kpis(engine, site="site-b") == {
        "buffered": 1,
        "parked": 0,
        "failed_last_interval": 1,
        "delivered_last_interval": 0,
        "oldest_pending_age_seconds": 120.0,
        "stuck": 0,
    }
    assert kpis(engine, site="site-a", node="node-2") == {
        "buffered": 1,
        "parked": 0,
        "failed_last_interval": 0,
        "delivered_last_interval": 1,
        "oldest_pending_age_seconds": 720.0,
        "stuck": 1,
    }


def test_the_sampler_writes_every_scope_and_the_series_reads_it(
    engine: sa.Engine, tmp_path
) -> None:
    fixture(engine)
    settings = Settings(data_dir=tmp_path)
    written = take_sample(engine, settings, NOW)
    # global + 2 sites + 3 nodes, six metrics each (every scope has a pending call here)
    assert written == 6 * 6
    take_sample(engine, settings, NOW + timedelta(minutes=1))
    with engine.connect() as conn:
        series = read_series(
            conn,
            source=SOURCE,
            metric="stuck",
            scope="node",
            scope_key="site-a/node-1",
            start=NOW - HOUR,
            end=NOW + HOUR,
            max_points=200,
        )
    assert [(p.captured_at_utc, p.value) for p in series] == [
        (NOW, 1.0),
        (NOW + timedelta(minutes=1), 1.0),
    ]


def test_samples_older_than_the_history_are_dropped(engine: sa.Engine, tmp_path) -> None:
    fixture(engine)
    settings = Settings(data_dir=tmp_path)
    take_sample(engine, settings, NOW - timedelta(days=91))
    take_sample(engine, settings, NOW)
    with engine.connect() as conn:
        series = read_series(
            conn,
            source=SOURCE,
            metric="buffered",
            scope="global",
            scope_key="",
            start=NOW - timedelta(days=100),
            end=NOW,
            max_points=200,
        )
    assert [p.captured_at_utc for p in series] == [NOW]


def test_downsampling_averages_equal_slices() -> None:
    start = NOW
    samples = [(start + timedelta(minutes=i), float(i)) for i in range(10)]
    # 10 minutes cut into 4 slices of 2.5 minutes: [0,1,2] [3,4] [5,6,7] [8,9]
    points = downsample(samples, start, start + timedelta(minutes=10), 4)
    assert [(p.captured_at_utc, p.value, p.min, p.max, p.samples) for p in points] == [
        (start, 1.0, 0.0, 2.0, 3),
        (start + timedelta(minutes=3), 3.5, 3.0, 4.0, 2),  # at its first sample
        (start + timedelta(minutes=5), 6.0, 5.0, 7.0, 3),
        (start + timedelta(minutes=8), 8.5, 8.0, 9.0, 2),
    ]
    assert len(downsample(samples, start, start + timedelta(minutes=10), 10)) == 10
    # The last instant belongs to the last slice, not one past it.
    edge = downsample(
        [*samples, (start + timedelta(minutes=10), 10.0)], start, start + timedelta(minutes=10), 2
    )
    assert [(p.samples, p.max) for p in edge] == [(5, 4.0), (6, 10.0)]


def test_a_downsampled_point_is_never_stamped_before_its_samples() -> None:
    # A day's window of five slices, sampled only in its last two hours: the point must
    # not claim a value 4.5 hours before the first sample was taken.
    end = NOW
    samples = [(end - timedelta(minutes=m), float(m)) for m in range(120, -1, -1)]
    (point,) = downsample(samples, end - timedelta(days=1), end, 5)
    assert point.captured_at_utc == samples[0][0] and point.samples == len(samples)


def test_one_sampler_of_several_samples(engine: sa.Engine, tmp_path) -> None:
    from controlroom.sitecalls.history import KpiSampler

    settings = Settings(data_dir=tmp_path)
    first = KpiSampler(engine, settings, clock=lambda: NOW)
    second = KpiSampler(engine, settings, clock=lambda: NOW + timedelta(minutes=1))
    try:
        assert first.sample_once() is not None
        assert second.sample_once() is None  # the first holds the lease
    finally:
        first._lease.release()
        second._lease.release()
