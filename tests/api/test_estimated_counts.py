"""``Total-Count`` over the exact-count limit (``exact_count_limit``): counted exactly up
to the limit, beyond it the provider's estimate marked ``Total-Count-Estimated: true``
(README, Compatibility). A search's estimate comes from the full-text index on every
provider; a list's only where the provider estimates a statement (PostgreSQL; SQLite
counts such lists exactly and marks nothing). Where the database keeps the count
(statuses, system messages and receiving endpoint: the tallies; a group by status: the
group counts) it is exact at any size. The page's rows never depend on the count."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from tests.factories import at, attempt, message_uuid

LIMIT = 10
MESSAGES = 40
EVERY_MODIFIED = {"modified": "2000-01-01T00:00:00Z...2100-01-01T00:00:00Z"}
"""A filter the tallies do not count by, matching every message: the count is the
provider's."""


@pytest.fixture
def capped(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> Iterator[TestClient]:
    """A client whose exact counts stop at ``LIMIT``, over ``MESSAGES`` failed messages
    (no time_sent: the default order is by id, descending), statistics up to date."""
    FailedMessageBatchWriter(engine).write(
        IngestionBatch(attempts=[attempt(n, at(n)) for n in range(MESSAGES)])
    )
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE failed_messages")
    limited = settings.model_copy(update={"exact_count_limit": LIMIT})
    with TestClient(create_app(limited, engine, body_store)) as test_client:
        yield test_client


def _estimates(client: TestClient) -> bool:
    """The provider estimates a list's statement (a search's estimate is every provider's)."""
    return client.app.state.engine.dialect.name == "postgresql"  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_count_over_the_limit_is_marked_as_an_estimate_and_the_page_is_right(
    capped: TestClient, method: str
) -> None:
    params = {"per_page": 5, "page": 2, **EVERY_MODIFIED}
    response = capped.request(method, "/api/errors", params=params)
    assert response.status_code == 200
    total = int(response.headers["Total-Count"])
    if _estimates(capped):
        assert response.headers["Total-Count-Estimated"] == "true"
        assert LIMIT + 1 <= total <= 10 * MESSAGES
    else:
        assert "Total-Count-Estimated" not in response.headers
        assert total == MESSAGES
    last = -(-total // 5)
    assert f'page={last}>; rel="last"' in response.headers["Link"]
    if method == "GET":
        expected = [message_uuid(n) for n in range(MESSAGES - 6, MESSAGES - 11, -1)]
        assert [item["id"] for item in response.json()] == expected


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/errors", {}),
        ("/api/errors", {"status": "unresolved"}),
        ("/api/messages", {}),
        ("/api/endpoints/Sales/errors", {}),
    ],
)
def test_lists_the_database_counts_are_exact_past_the_limit(
    capped: TestClient, path: str, params: dict[str, str]
) -> None:
    """Filtered by statuses, system messages and receiving endpoint only, a list's total
    comes from the tallies (migration 0012): exact and unmarked past the limit, on every
    provider (a stale estimate after bulk changes once cut ServicePulse's last page)."""
    response = capped.get(path, params={"per_page": 5, **params})
    assert response.status_code == 200
    assert response.headers["Total-Count"] == str(MESSAGES)
    assert "Total-Count-Estimated" not in response.headers
    assert len(response.json()) == 5


def test_a_queue_addresss_count_in_a_status_is_estimated_from_the_statistics(
    capped: TestClient,
) -> None:
    """A queue address's page and count in a status keep the status from every index
    (``Provider.never_indexed``), its selectivity still estimated from the column's
    statistics: the estimate is near the matches, not a default guess of one in 200."""
    params = {"per_page": 5, "status": "unresolved", "queueaddress": "sales"}
    response = capped.get("/api/errors", params=params)
    assert response.status_code == 200
    assert len(response.json()) == 5
    total = int(response.headers["Total-Count"])
    if _estimates(capped):
        assert response.headers["Total-Count-Estimated"] == "true"
        assert MESSAGES // 2 <= total <= 2 * MESSAGES
    else:
        assert total == MESSAGES


def test_a_count_within_the_limit_stays_exact_and_unmarked(
    capped: TestClient, engine: sa.Engine
) -> None:
    response = capped.get("/api/errors", params={"per_page": 5, "status": "archived"})
    assert response.headers["Total-Count"] == "0"
    assert "Total-Count-Estimated" not in response.headers
    with engine.begin() as conn:  # exactly LIMIT archived: still counted, not estimated
        conn.execute(
            sa.update(failed_messages)
            .where(failed_messages.c.id.in_([message_uuid(n) for n in range(LIMIT)]))
            .values(status=int(FailedMessageStatus.ARCHIVED))
        )
    at_limit = capped.get("/api/errors", params={"per_page": 5, "status": "archived"})
    assert at_limit.headers["Total-Count"] == str(LIMIT)
    assert "Total-Count-Estimated" not in at_limit.headers


@pytest.mark.parametrize(
    "path",
    ["/api/messages/search/failed", "/api/messages/search"],
)
@pytest.mark.parametrize("page", [1, 3])
def test_searches_and_lists_over_the_limit_show_the_rows_an_exact_count_shows(
    capped: TestClient, client: TestClient, path: str, page: int
) -> None:
    params = {"per_page": "7", "page": str(page), "q": "failed"}
    estimated = capped.get(path, params=params)
    exact = client.get(path, params=params)
    assert estimated.status_code == exact.status_code == 200
    assert exact.headers["Total-Count"] == str(MESSAGES)
    assert "Total-Count-Estimated" not in exact.headers
    assert [item["id"] for item in estimated.json()] == [item["id"] for item in exact.json()]
    assert len(exact.json()) == 7
    assert estimated.headers["Total-Count-Estimated"] == "true"
    assert int(estimated.headers["Total-Count"]) >= LIMIT + 1


def test_the_console_says_about_for_an_estimate(capped: TestClient, engine: sa.Engine) -> None:
    """More matches than the console's page (50), so its full first page keeps the
    estimate; a short page would end the matches and count them exactly."""
    more = [attempt(n, at(n)) for n in range(MESSAGES, MESSAGES + 20)]
    FailedMessageBatchWriter(engine).write(IngestionBatch(attempts=more))
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE failed_messages")
    html = capped.get("/messages", params={"q": "failed"}).text
    shown = re.search(r'data-testid="total">([^<]*)<', html)
    assert shown is not None
    # The console filters by status (Unresolved): PostgreSQL's planner's estimate, on
    # SQLite its full-text index's sample of the hits tested for the status.
    assert re.fullmatch(r"about \d+ messages", shown[1])
    assert int(shown[1].split()[1]) >= LIMIT + 1
    every = capped.get("/messages").text  # counted by the tallies: exact
    total = re.search(r'data-testid="total">([^<]*)<', every)
    assert total is not None and total[1] == f"{MESSAGES + 20} messages"


def test_a_big_groups_count_is_exact_and_its_page_is_right(
    capped: TestClient, client: TestClient, engine: sa.Engine
) -> None:
    """A group's messages filtered by status alone are counted from the group counts the
    database keeps (migration 0014): exact past the limit, never marked an estimate."""
    members = range(100, 100 + 2 * LIMIT)
    FailedMessageBatchWriter(engine).write(
        IngestionBatch(attempts=[attempt(n, at(n), exception_message="boom") for n in members])
    )
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
    group_id = uuid.uuid5(uuid.NAMESPACE_URL, "boom")
    path = f"/api/recoverability/groups/{group_id}/errors"
    for params in ({"per_page": "6", "page": "2"}, {"per_page": "6", "status": "unresolved"}):
        capped_answer, exact = capped.get(path, params=params), client.get(path, params=params)
        assert exact.headers["Total-Count"] == str(2 * LIMIT)
        assert capped_answer.headers["Total-Count"] == str(2 * LIMIT)
        assert "Total-Count-Estimated" not in capped_answer.headers
        assert [item["id"] for item in capped_answer.json()] == [
            item["id"] for item in exact.json()
        ]
        assert len(exact.json()) == 6


@pytest.mark.parametrize(
    ("path", "params"), [("/api/errors", EVERY_MODIFIED), ("/api/messages/search/failed", {})]
)
def test_an_estimate_is_never_below_the_rows_seen_so_paging_goes_on(
    capped: TestClient, path: str, params: dict[str, str]
) -> None:
    """A planner's estimate may fall short of the matches (two words it takes for
    independent); the last full page must still link to the next one."""
    response = capped.get(path, params={"per_page": "5", "page": str(MESSAGES // 5), **params})
    assert len(response.json()) == 5
    if "search" in path or _estimates(capped):
        assert int(response.headers["Total-Count"]) >= MESSAGES + 1
        assert 'rel="next"' in response.headers["Link"]
        page = str(MESSAGES // 5 + 1)
        beyond = capped.get(path, params={"per_page": "5", "page": page, **params})
        assert beyond.json() == []
    else:
        assert response.headers["Total-Count"] == str(MESSAGES)


def _pages_by_link(client: TestClient, path: str, params: dict[str, str]) -> list[str]:
    """Every id a client paging by ``Link`` from the first page is shown, in order: it
    follows ``rel="next"`` until a page is empty or links no further."""
    ids: list[str] = []
    response = client.get(path, params=params)
    for _ in range(2 * MESSAGES):
        assert response.status_code == 200
        ids += [item["id"] for item in response.json()]
        following = re.search(r'<([^>]*)>; rel="next"', response.headers.get("Link", ""))
        if not response.json() or following is None:
            return ids
        response = client.get("/api/" + following[1])  # relative to /api/, as ServiceControl's
    raise AssertionError("paging by Link did not end")


@pytest.mark.parametrize("text", ["failed at", "Sales failed"])
def test_a_search_of_many_matches_is_an_estimate_and_pages_by_link_to_the_end(
    capped: TestClient, client: TestClient, text: str
) -> None:
    """Two words each in every message, past the limit: on every provider the total is an
    estimate, marked, never below the limit + 1 nor far above; paging by ``Link`` shows
    every match once, in the exact answer's order (docs/decisions.md "SQLite counts
    searches in the full-text index": SQLite counted all 287,000 matches of a broad search,
    5 s at 1,000,000)."""
    path, params = "/api/messages/search", {"q": text, "per_page": "7"}
    first = capped.get(path, params=params)
    assert first.headers["Total-Count-Estimated"] == "true"
    assert LIMIT + 1 <= int(first.headers["Total-Count"]) <= 10 * MESSAGES
    exact = client.get(path, params={**params, "per_page": str(MESSAGES)})
    assert exact.headers["Total-Count"] == str(MESSAGES)
    assert _pages_by_link(capped, path, params) == [item["id"] for item in exact.json()]


def test_words_that_never_occur_together_answer_zero_exactly(
    capped: TestClient, engine: sa.Engine
) -> None:
    """Each word in more messages than the limit, never both in one: the capped count
    answers 0, exact and unmarked, on every provider (an estimate of the two would be
    far from 0)."""
    FailedMessageBatchWriter(engine).write(
        IngestionBatch(
            attempts=[attempt(100 + n, at(n), exception_message="alphaword") for n in range(12)]
            + [attempt(200 + n, at(n), exception_message="betaword") for n in range(12)]
        )
    )
    # One dotted word: the route ORs words (as ServiceControl), a word's parts must all occur.
    response = capped.get("/api/messages/search", params={"q": "alphaword.betaword"})
    assert response.status_code == 200
    assert response.headers["Total-Count"] == "0"
    assert "Total-Count-Estimated" not in response.headers
    assert response.json() == []


@pytest.mark.parametrize(
    ("path", "params"), [("/api/errors", EVERY_MODIFIED), ("/api/messages/search/failed", {})]
)
def test_a_short_page_answers_the_exact_total(
    capped: TestClient, path: str, params: dict[str, str]
) -> None:
    """A page with fewer rows than asked for ends the matches: its total is the rows
    before it and on it, exact and unmarked, whatever was estimated (fresh-user pass:
    the last page of a search still said "about")."""
    last = -(-MESSAGES // 7)
    response = capped.get(path, params={"per_page": "7", "page": str(last), **params})
    assert len(response.json()) == MESSAGES - 7 * (last - 1)
    assert response.headers["Total-Count"] == str(MESSAGES)
    assert "Total-Count-Estimated" not in response.headers
    assert 'rel="next"' not in response.headers["Link"]
