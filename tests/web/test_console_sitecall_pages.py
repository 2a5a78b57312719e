"""The site-call pages over HTTP (no browser), on every provider: filters and keyset
paging of the site-call list and the audit log, 400s naming the field, the trend charts'
geometry, the sites' reconciliation state."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.kpi_history import SeriesPoint
from controlroom.db.tables import site_calls, site_reconciliation
from controlroom.db.transactions import begin_write
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.sitecalls.history import take_sample
from controlroom.web import charts
from controlroom.web.filters import iso
from tests.reconciliation.harness import site_entry
from tests.web.test_console_http import csrf_of
from tests.web.test_console_sitecalls import packet

CALL_LINK = re.compile(r'href="/site-calls/([0-9a-f-]{36})"')


@pytest.fixture
def console(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> Iterator[TestClient]:
    configured = settings.model_copy(
        update={"sites": [site_entry("plant-7", "http://127.0.0.1:9", telemetry_token=False)]}
    )
    with TestClient(create_app(configured, engine, body_store), follow_redirects=False) as client:
        yield client


def post(console: TestClient, packets: list[dict]) -> None:
    answer = console.post("/api/site-calls/telemetry", json=packets)
    assert answer.status_code == 200 and answer.json()["rejected"] == [], answer.text


def test_the_site_call_list_filters_and_pages_by_keyset_without_repeats(
    console: TestClient,
) -> None:
    start = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    # 120 calls, three per instant (ties), half on another site.
    packets = [
        packet(
            "Delivered" if n % 2 else "Parked",
            created=start + timedelta(seconds=n // 3),
            terminal=start + timedelta(seconds=n // 3, minutes=1) if n % 2 else None,
            site="plant-7" if n % 4 < 2 else "plant-9",
        )
        for n in range(120)
    ]
    post(console, packets)
    wanted = {
        p["tracked_operation_id"]
        for p in packets
        if p["source_site"] == "plant-7" and p["status"] == "Parked"
    }
    seen: list[str] = []
    url = "/site-calls?site=plant-7&status=Parked"
    while url:
        answer = console.get(url)
        assert answer.status_code == 200
        seen += CALL_LINK.findall(answer.text)
        older = re.search(r'href="(/site-calls\?[^"]*after=[^"]*)">Older', answer.text)
        url = older.group(1).replace("&amp;", "&") if older else ""
    assert len(seen) == len(set(seen)) == len(wanted)
    assert set(seen) == wanted

    created = console.get("/site-calls?from=2026-12-01T08:00:10&to=2026-12-01T08:00:20")
    assert len(CALL_LINK.findall(created.text)) == 30  # ten instants of three calls


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/site-calls?from=yesterday", "from"),
        ("/site-calls?status=Lost", "status"),
        ("/site-calls?after=not-a-cursor", "after"),
        ("/site-calls?scope_node=node-a", "scope_node"),
        ("/audit-log?to=soon", "to"),
        ("/audit-log?after=xyz", "after"),
        ("/site-calls/rejected?after=xyz", "after"),
    ],
)
def test_a_filter_that_cannot_be_read_is_a_400_naming_it(
    console: TestClient, path: str, field: str
) -> None:
    answer = console.get(path)
    assert answer.status_code == 400
    assert f"{field}" in answer.text


def test_the_audit_log_filters_by_each_field(console: TestClient) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    post(
        console,
        [
            packet(
                "Submitted",
                created=now - timedelta(minutes=n),
                event={"actor": f"node-{n % 2}", "action": "CallSubmitted", "target": f"t{n % 3}"},
            )
            for n in range(12)
        ],
    )
    assert console.get("/audit-log").text.count("CallSubmitted") == 12
    assert console.get("/audit-log?actor=node-1").text.count("CallSubmitted") == 6
    assert console.get("/audit-log?actor=node-1&target=t0").text.count("CallSubmitted") == 2
    assert console.get("/audit-log?outcome=Failure").text.count("CallSubmitted") == 0
    since = (now - timedelta(minutes=3, seconds=30)).strftime("%Y-%m-%dT%H:%M:%S")
    assert console.get(f"/audit-log?from={since}").text.count("CallSubmitted") == 4


def test_the_sites_page_shows_each_configured_site_and_its_state(console: TestClient) -> None:
    answer = console.get("/sites")
    assert answer.status_code == 200
    assert 'data-testid="site-plant-7"' in answer.text
    assert "never" in answer.text  # never pulled yet
    assert "token" not in answer.text.lower().split("<main>")[1].split("</main>")[0].replace(
        "csrf_token", ""
    )


def test_the_sites_page_shows_a_site_s_cursor_to_100_ns(
    console: TestClient, engine: sa.Engine
) -> None:
    # A site pulled at least once has a cursor: a stamp of 100 ns, not a datetime.
    pulled = datetime(2026, 12, 4, 9, 30, 1, 123456, tzinfo=UTC)
    with begin_write(engine) as conn:
        conn.execute(
            sa.insert(site_reconciliation).values(
                site_id="plant-7",
                cursor_updated_at_utc=pulled,
                cursor_updated_at_tick=7,
                cursor_tracked_operation_id=str(uuid.UUID(int=7)),
                last_pull_at_utc=pulled,
                last_success_at_utc=pulled,
                reachable=True,
                pinned=False,
                rows_pulled=12,
            )
        )
    answer = console.get("/sites")
    assert answer.status_code == 200, answer.text
    assert "2026-12-04 09:30:01.1234567 UTC" in answer.text


def test_the_trends_are_drawn_from_the_kpi_history(
    console: TestClient, engine: sa.Engine, settings: Settings
) -> None:
    now = datetime.now(UTC)
    post(console, [packet("Parked", created=now - timedelta(hours=2)) for _ in range(3)])
    take_sample(engine, settings, now - timedelta(hours=1))
    answer = console.get("/")
    assert 'data-testid="trend-parked"' in answer.text
    parked = answer.text.split('data-testid="trend-parked"')[1].split("</figure>")[0]
    assert "Latest: 3 calls at" in parked and "<polyline" in parked
    age = answer.text.split('data-testid="trend-oldest_pending_age_seconds"')[1]
    # Nothing was buffered, so no age was sampled: an empty chart, not a made-up zero.
    assert "No samples in the last 24 hours" in age.split("</figure>")[0]


def test_a_charts_axes_scale_to_its_values_and_label_utc_times() -> None:
    start = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)
    end = start + timedelta(hours=24)
    series = [
        SeriesPoint(start + timedelta(hours=6), 3.0, 3.0, 3.0, 1),
        SeriesPoint(start + timedelta(hours=18), 7.0, 7.0, 7.0, 1),
    ]
    chart = charts.build_chart("parked", series, start=start, end=end)
    assert [tick.label for tick in chart.y_ticks] == ["0", "2", "4", "6", "8", "10"]
    assert [tick.label for tick in chart.x_ticks] == [
        "00:00 UTC",
        "06:00 UTC",
        "12:00 UTC",
        "18:00 UTC",
        "00:00 UTC",
    ]
    (x1, y1, label1), (x2, y2, _) = chart.dots
    assert x1 == chart.x_ticks[1].position and x2 == chart.x_ticks[3].position
    assert y2 < y1  # higher value, higher on the page
    assert label1 == "3 calls at 06:00 UTC"
    assert chart.latest == "7 calls at 18:00 UTC"
    age = charts.build_chart("oldest_pending_age_seconds", series[:1], start=start, end=end)
    assert age.unit == "seconds" and age.latest == "3 s at 06:00 UTC"
    assert [tick.label for tick in age.y_ticks] == ["0 s", "1 s", "2 s", "3 s", "4 s", "5 s"]
    hours = [SeriesPoint(start + timedelta(hours=20), 3 * 3600.0, 0, 0, 1)]
    long_age = charts.build_chart("oldest_pending_age_seconds", hours, start=start, end=end)
    assert [tick.label for tick in long_age.y_ticks] == ["0 h", "1 h", "2 h", "3 h", "4 h", "5 h"]
    assert long_age.latest == "3.0 h at 20:00 UTC"


@pytest.mark.parametrize(
    ("value", "ceiling"),
    [(0, 1), (0.4, 1), (1, 1), (1.2, 2), (3, 5), (7, 10), (12, 20), (240, 250)],
)
def test_the_axis_top_is_a_round_number_at_least_the_largest_value(
    value: float, ceiling: float
) -> None:
    assert charts.nice_ceiling(value) == ceiling


def test_relaying_a_call_central_does_not_have_says_not_found(console: TestClient) -> None:
    page = console.get("/site-calls")  # the open console's session
    token = csrf_of(page.text)
    unknown = uuid.uuid4()
    for command in ("retry", "discard"):
        answer = console.post(f"/site-calls/{unknown}/{command}", data={"csrf_token": token})
        assert answer.status_code == 303 and answer.headers["location"] == "/site-calls"
        shown = console.get("/site-calls")
        assert f"central has no site call {unknown}" in shown.text
        assert 'data-testid="flash-code">NotFound<' in shown.text


def test_relaying_a_call_that_is_not_parked_says_not_parked_and_sends_nothing(
    console: TestClient,
) -> None:
    delivered = packet(
        "Delivered", created=datetime.now(UTC) - timedelta(minutes=2), terminal=datetime.now(UTC)
    )
    post(console, [delivered])
    call = f"/site-calls/{delivered['tracked_operation_id']}"
    page = console.get(call)
    assert "/retry" not in page.text and "/discard" not in page.text  # no buttons
    answer = console.post(f"{call}/retry", data={"csrf_token": csrf_of(page.text)})
    assert answer.status_code == 303 and answer.headers["location"] == call
    assert 'data-testid="flash-code">NotParked<' in console.get(call).text
    assert 'data-testid="flash"' not in console.get(call).text  # shown once


def test_a_calls_state_polls_and_waits_for_the_sites_report_after_a_command(
    console: TestClient, engine: sa.Engine
) -> None:
    parked = packet("Parked", created=datetime.now(UTC) - timedelta(minutes=2))
    post(console, [parked])
    call = f"/site-calls/{parked['tracked_operation_id']}"
    page = console.get(call).text
    assert f'hx-get="{call}/state"' in page and "/retry" in page
    with engine.connect() as conn:
        received = conn.execute(
            sa.select(site_calls.c.ingested_at_utc).where(
                site_calls.c.tracked_operation_id == parked["tracked_operation_id"]
            )
        ).scalar_one()

    # Polled after an applied command, central still holding the state shown then.
    waiting = console.get(f"{call}/state", params={"since": iso(received)}).text
    assert 'data-testid="awaiting-site"' in waiting and "/retry" not in waiting
    assert "/state?since=" in waiting  # keeps waiting on its next poll
    # The site reported since: the call's state as it is, with its buttons.
    reported = console.get(f"{call}/state", params={"since": "2000-01-01T00:00:00+00:00"}).text
    assert 'data-testid="awaiting-site"' not in reported and "/retry" in reported

    delivered = {**parked, "status": "Delivered", "terminal_at_utc": datetime.now(UTC).isoformat()}
    delivered["updated_at_utc"] = delivered["terminal_at_utc"]
    post(console, [delivered])
    assert "hx-get" not in console.get(f"{call}/state").text  # terminal: no more polls


def test_the_audit_log_page_shows_the_last_verification(
    console: TestClient, engine: sa.Engine
) -> None:
    from controlroom.sitecalls.audit_verify import record_verification, verify_audit_log
    from tests.sitecalls.test_audit_guarantees import tamper

    assert "Hash chain not verified yet" in console.get("/audit-log").text
    now = datetime.now(UTC)
    event = {"actor": "node-1", "action": "CallSubmitted", "target": "t"}
    post(console, [packet("Submitted", created=now, event=event)])
    record_verification(engine, verify_audit_log(engine))
    page = console.get("/audit-log").text
    assert "Hash chain intact" in page
    assert "1 event in 1 monthly chain," in page  # singular where one

    with engine.connect() as conn:
        event_id = conn.exec_driver_sql("SELECT event_id FROM audit_log").scalar_one()
    tamper(engine, event_id)
    record_verification(engine, verify_audit_log(engine))
    page = console.get("/audit-log").text
    assert "Hash chain broken" in page and event_id in page


def test_the_site_call_pages_kpi_tiles_poll_a_fragment_of_their_scope(console: TestClient) -> None:
    now = datetime.now(UTC)
    post(console, [packet("Parked", created=now), packet("Parked", created=now, site="plant-9")])
    page = console.get("/site-calls", params={"scope_site": "plant-7"})
    assert 'hx-get="/live/site-calls?scope_site=plant-7"' in page.text

    tiles = console.get("/live/site-calls", params={"scope_site": "plant-7"})
    assert tiles.status_code == 200
    assert re.search(r'data-testid="kpi-parked">\s*<span class="figure">1<', tiles.text)
    assert "<html" not in tiles.text
    everywhere = console.get("/live/site-calls")
    assert re.search(r'data-testid="kpi-parked">\s*<span class="figure">2<', everywhere.text)
    assert console.get("/live/site-calls", params={"scope_node": "node-a"}).status_code == 400
