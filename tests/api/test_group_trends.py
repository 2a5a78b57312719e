"""Which failures are new and growing, on every provider (migration 0022): each group's
failures per hour over the last day, counted by the database as group rows are written
(a failure again counts again, a duplicate delivery does not), its growth, the groups
sorted by growth, in the API (extra fields ServicePulse ignores) and on the console."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.read import groups
from controlroom.errors.tallies import fold_deltas
from tests.nsb import failed_headers
from tests.retries.conftest import store_failed

NOW = datetime.now(UTC).replace(minute=30, second=0, microsecond=0)
"""The middle of the current hour: every failure below falls in a known hour."""


def hours_ago(hours: float) -> datetime:
    return NOW - timedelta(hours=hours)


@pytest.fixture
def stored(
    settings: Settings, writer: FailedMessageBatchWriter, body_store: FileSystemBodyStore
) -> None:
    """Group "Steady" (System.TimeoutException): failures 30 h, 20 h and 19 h ago, the
    latest 1 h ago. Group "Storm" (Shop.StormException): 4 in the last two hours, one of
    them failed twice (again after a retry) and delivered twice (a duplicate)."""

    def fail(message_id: str, exception_type: str, when: datetime) -> None:
        headers = failed_headers(message_id, failed_at=when, exception_type=exception_type)
        store_failed(settings, writer, body_store, headers)

    for n, when in enumerate([hours_ago(30), hours_ago(20), hours_ago(19), hours_ago(1)]):
        fail(f"steady-{n}", "System.TimeoutException", when)
    for n in range(3):
        fail(f"storm-{n}", "Shop.StormException", hours_ago(1))
    fail("storm-0", "Shop.StormException", hours_ago(0))  # failed again: a new attempt
    fail("storm-0", "Shop.StormException", hours_ago(0))  # the same attempt delivered again


def by_title(found: list[groups.GroupSummary]) -> dict[str, groups.GroupSummary]:
    return {group.title.split(":")[0]: group for group in found}


def test_each_group_counts_its_failures_per_hour_of_the_last_day(
    engine: sa.Engine, stored: None
) -> None:
    fold_deltas(engine)  # PostgreSQL: the folded rows read the same as the appended ones
    with engine.connect() as conn:
        found = by_title(groups.list_groups(conn, groups.DEFAULT_CLASSIFIER, now=NOW))

    steady, storm = found["System.TimeoutException"], found["Shop.StormException"]
    assert len(steady.failures_per_hour) == groups.HOURS_SHOWN
    expected_steady = [0] * 24
    expected_steady[23 - 20] = 1
    expected_steady[23 - 19] = 1
    expected_steady[23 - 1] = 1  # 30 h ago is before the day shown
    assert list(steady.failures_per_hour) == expected_steady
    expected_storm = [0] * 24
    expected_storm[22] = 3
    expected_storm[23] = 1
    assert list(storm.failures_per_hour) == expected_storm
    assert (steady.growth, storm.growth) == (1 - 2, 4)


def test_the_groups_sort_by_growth(engine: sa.Engine, stored: None) -> None:
    with engine.connect() as conn:
        by_last = groups.list_groups(conn, groups.DEFAULT_CLASSIFIER, now=NOW)
        by_growth = groups.list_groups(conn, groups.DEFAULT_CLASSIFIER, now=NOW, sort="growth")

    assert [group.growth for group in by_growth] == sorted(
        (group.growth for group in by_last), reverse=True
    )
    assert by_growth[0].title.startswith("Shop.StormException")


def test_the_api_carries_the_hours_and_sorts_by_growth(client: TestClient, stored: None) -> None:
    listed = client.get("/api/recoverability/groups")
    grown = client.get("/api/recoverability/groups", params={"sort": "growth"})

    assert listed.status_code == 200 and grown.status_code == 200
    for item in listed.json():
        assert len(item["failures_per_hour"]) == 24
        assert item["growth"] == sum(item["failures_per_hour"][12:]) - sum(
            item["failures_per_hour"][:12]
        )
        assert {"first", "last", "count"} <= set(item)
    growths = [item["growth"] for item in grown.json()]
    assert growths == sorted(growths, reverse=True)
    assert grown.json()[0]["title"].startswith("Shop.StormException")
    storm = next(item for item in listed.json() if item["title"].startswith("Shop.Storm"))
    assert sum(storm["failures_per_hour"]) == 4
    ascending = client.get(
        "/api/recoverability/groups", params={"sort": "growth", "direction": "asc"}
    )
    growths_up = [item["growth"] for item in ascending.json()]
    assert growths_up == sorted(growths_up) and growths_up != growths
    earliest = client.get("/api/recoverability/groups", params={"direction": "asc"}).json()
    assert earliest == listed.json()[::-1]
    # Unknown sort values read as the default order, as ServiceControl reads them.
    assert client.get("/api/recoverability/groups", params={"sort": "x"}).json() == listed.json()


def test_the_console_draws_a_sparkline_without_script_and_sorts(
    client: TestClient, stored: None
) -> None:
    page = client.get("/groups")
    grown = client.get("/groups", params={"sort": "growth"})

    assert page.status_code == 200 and grown.status_code == 200
    sparklines = re.findall(r"<svg[^>]*class=\"sparkline\"[^>]*>", page.text)
    assert len(sparklines) == 2
    assert all('role="img"' in svg and "aria-label=" in svg for svg in sparklines)
    assert "<script" not in page.text.split("<main", 1)[1]
    assert "First seen" in page.text and "Last seen" in page.text
    assert 'href="/groups?classifier=' in page.text and "sort=growth" in page.text
    titles = re.findall(r'data-group-title="([^"]+)"', grown.text)
    assert titles[0].startswith("Shop.StormException")
