"""A broad search (estimated at ``BROAD_SEARCH_ESTIMATE`` times the exact-count limit or
more) finds its page among the first rows of the sort order and answers the estimate,
marked ``Total-Count-Estimated: true``, without counting; where that window holds no full
page (words that never occur together, matches only among old messages) it is counted as
any search is. Either way the rows are those an exact search shows. SQLite, without a
planner's estimate, samples its full-text index's hits (and their rows, for a filter)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.providers import provider_for
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.identity import unique_message_id
from controlroom.errors.ingest.search_terms import parse_search
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.read.filters import FailedMessageFilter, Ordering
from controlroom.errors.read.search import (
    BROAD_SEARCH_ESTIMATE,
    search_condition,
    search_failed_messages,
)
from controlroom.errors.read.summaries import SearchPage
from tests.factories import at, attempt

LIMIT = 5
MESSAGES = 300
OLD = 60
"""The oldest messages (the lowest ids: the default order is by id, descending) are the
only ones that say "rare"."""


def _text(n: int) -> str:
    word = "alpha" if n % 2 else "beta"  # never both in one message
    return f"failed {word} {'rare' if n < OLD else 'common'} number{n}"


@pytest.fixture
def clients(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> Iterator[tuple[TestClient, TestClient]]:
    """A client whose exact counts stop at ``LIMIT``, and one that always counts, over
    ``MESSAGES`` failed messages, statistics up to date."""
    attempts = [attempt(n, at(n), exception_message=_text(n)) for n in range(MESSAGES)]
    FailedMessageBatchWriter(engine).write(IngestionBatch(attempts=attempts))
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE failed_messages")
    limited = settings.model_copy(update={"exact_count_limit": LIMIT})
    with (
        TestClient(create_app(limited, engine, body_store)) as capped,
        TestClient(create_app(settings, engine, body_store)) as exact,
    ):
        yield capped, exact


def _estimates(engine: sa.Engine) -> bool:
    return engine.dialect.name == "postgresql"


class _Counts:
    """While active, counts the statements that count the matches (the capped count of
    ``count_matching``, ``AS matching``; ``uncapped``: those without a LIMIT, counting
    every match), and those that collect every match with the page (``_search_page``'s
    ``hits``)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.seen = 0
        self.uncapped = 0
        self.collected = 0

    def _record(self, _conn: object, _cursor: object, statement: str, *_args: object) -> None:
        counting = "count(" in statement.lower() and " AS matching" in statement
        self.seen += counting
        self.uncapped += counting and "LIMIT" not in statement
        self.collected += "hits AS MATERIALIZED" in statement

    def __enter__(self) -> _Counts:
        sa.event.listen(self.engine, "before_cursor_execute", self._record)
        return self

    def __exit__(self, *_exc: object) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._record)


@pytest.mark.parametrize("page", [1, 4])
def test_a_broad_search_answers_the_estimate_without_counting(
    clients: tuple[TestClient, TestClient], engine: sa.Engine, page: int
) -> None:
    capped, exact = clients
    params = {"q": "failed", "per_page": "5", "page": str(page)}
    with _Counts(engine) as counts:
        answer = capped.get("/api/messages/search", params=params)
    expected = exact.get("/api/messages/search", params=params)
    assert answer.status_code == expected.status_code == 200
    assert [item["id"] for item in answer.json()] == [item["id"] for item in expected.json()]
    assert expected.headers["Total-Count"] == str(MESSAGES)
    if _estimates(engine):
        assert counts.seen == 0
        assert answer.headers["Total-Count-Estimated"] == "true"
        assert BROAD_LOW <= int(answer.headers["Total-Count"]) <= 10 * MESSAGES
        assert 'rel="next"' in answer.headers["Link"]
    else:  # counted, or estimated from the full-text index (SQLite)
        assert answer.headers["Total-Count"] == str(MESSAGES)


BROAD_LOW = BROAD_SEARCH_ESTIMATE * LIMIT
"""What the planner must at least estimate for the search to count as broad."""


def test_words_that_never_occur_together_answer_none_exactly(
    clients: tuple[TestClient, TestClient], engine: sa.Engine
) -> None:
    """Taken for independent, "alpha beta" is estimated at a quarter of the messages; the
    window holds no page, so the search is counted: 0, exact."""
    capped, _ = clients
    if _estimates(engine):
        with engine.connect() as conn:
            condition = search_condition(engine.dialect, "alpha beta")
            matching = sa.select(sa.literal(1)).select_from(failed_messages)
            estimate = provider_for(conn).estimate_rows(conn, matching.where(condition))
        assert estimate is not None and estimate >= BROAD_LOW  # the case this test is about
    # One dotted word: ServiceControl's routes OR words, but a word's parts must all occur.
    answer = capped.get("/api/messages/search", params={"q": "alpha.beta", "per_page": "5"})
    assert answer.status_code == 200
    assert answer.json() == []
    assert answer.headers["Total-Count"] == "0"
    assert "Total-Count-Estimated" not in answer.headers


def test_matches_only_among_old_messages_are_found_by_counting(
    clients: tuple[TestClient, TestClient], engine: sa.Engine
) -> None:
    """The word "rare" is in the 60 oldest messages: past the window of a first page, so the
    search is counted and its page read as any search's."""
    capped, exact = clients
    params = {"q": "rare", "per_page": "5"}
    with _Counts(engine) as counts:
        answer = capped.get("/api/messages/search", params=params)
    expected = exact.get("/api/messages/search", params=params)
    assert [item["id"] for item in answer.json()] == [item["id"] for item in expected.json()]
    assert len(expected.json()) == 5
    assert expected.headers["Total-Count"] == str(OLD)
    # Past the limit, the walk stops short of the old matches: they are collected and
    # counted with the page (``_search_page_of_many``), so the total is exact.
    assert counts.collected > 0
    assert answer.headers["Total-Count"] == str(OLD)
    assert "Total-Count-Estimated" not in answer.headers


def test_a_search_within_the_limit_is_exact_though_its_matches_are_stored_first(
    engine: sa.Engine,
) -> None:
    """Ten of 5,000 messages say both "alpha" and "beta": the first stored (the first
    pages of the table) and the newest failures; every other message says one of the two
    words, so the planner estimates many. Ids are UniqueMessageIds, digests of the
    message id and endpoint, unrelated to content, time or storage: the first by id are
    a random sample, in which the ten are as rare as they are, so the search is counted
    and exact. A sample by storage or time order would hold all ten and pass for many.

    (Break-it pass: with the tests' sequential ids, the ten lowest ids holding the ten
    matches, the sample held them all and answered 100, marked estimated: the service's
    ids are digests, never sequential.)"""
    messages, both = 5_000, 10
    attempts = []
    for n in range(messages):
        word = "alpha beta" if n < both else ("alpha" if n % 2 else "beta")
        made = attempt(n, at(messages - n), exception_message=f"failed {word}")
        attempts.append(replace(made, unique_message_id=unique_message_id(made.headers)))
    writer = FailedMessageBatchWriter(engine, clock=lambda: at(10**6))
    for start in range(0, messages, 1_000):
        writer.write(IngestionBatch(attempts=attempts[start : start + 1_000]))
    if _estimates(engine):
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE failed_messages")
    newest_first = Ordering("time_of_failure")
    with engine.connect() as conn:
        exact = search_failed_messages(conn, "alpha beta", offset=0, limit=1, order=newest_first)
        capped = search_failed_messages(
            conn, "alpha beta", offset=0, limit=1, order=newest_first, exact_count_limit=both
        )
    assert exact.total == both
    assert capped.items == exact.items
    assert (capped.total, capped.total_estimated) == (both, False)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("text", ["quiet*", "quietly"])
def test_the_rows_of_a_window_are_tested_one_by_one_never_collected_from_the_index(
    engine: sa.Engine, text: str
) -> None:
    """A search tested among a window of rows (a walk's window) is never answered from the
    full-text index, whatever the planner thinks of the term: collecting every match of
    a prefix the planner prices as rare, to join them to the window, cost 262 ms at
    1,000,000 messages where testing the window's rows took 32 (docs/decisions.md "A
    subset is read from its own rows")."""
    window = sa.select(failed_messages.c.id).order_by(failed_messages.c.id).limit(10)
    condition = provider_for(engine).search_matches(parse_search(text), among=window)
    statement = sa.select(failed_messages.c.id).where(condition)
    with engine.connect() as conn:
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # the index, if it can
        compiled = statement.compile(dialect=conn.dialect)
        plan = conn.exec_driver_sql(f"EXPLAIN {compiled}", compiled.params).scalars().all()
    assert not [line for line in plan if "search_vector" in line and "Index" in line], plan


@pytest.mark.parametrize("page", [1, 4])
def test_a_broad_search_within_a_status_answers_an_estimate_without_counting(
    clients: tuple[TestClient, TestClient], engine: sa.Engine, page: int
) -> None:
    """The console's search is among the Unresolved by default: a broad one is estimated
    and its page found as the API's search without a status is, never by collecting or
    counting every match among the status (on SQLite, which has no planner's estimate,
    it read every match's row: 0.5 s for 200,000 of 1,000,000, ``benchmarks/README.md``).
    The console's page of such a search says the total is about that many."""
    capped, _ = clients
    unresolved = FailedMessageFilter(statuses=frozenset({FailedMessageStatus.UNRESOLVED}))
    newest_first = Ordering("time_of_failure")

    def search(exact_count_limit: int | None) -> SearchPage:
        with engine.connect() as conn:
            return search_failed_messages(
                conn,
                "failed",
                offset=(page - 1) * 5,
                limit=5,
                order=newest_first,
                where=unresolved,
                exact_count_limit=exact_count_limit,
                widen=True,
            )

    with _Counts(engine) as counts:
        found = search(LIMIT)
    expected = search(None)
    assert expected.total == MESSAGES
    assert found.items == expected.items
    # At most the capped count of whether a walk pays (``_walk_pays``: up to the square
    # root of the rows walked x all messages, 39 here; none at the console's page of 50
    # and 1,000,000 messages, where that is below the limit).
    assert (counts.uncapped, counts.collected) == (0, 0)
    assert found.total_estimated
    assert BROAD_LOW <= found.total <= 10 * MESSAGES
    if page == 1:  # the console's first page (50 rows) of the same search
        html = capped.get("/messages", params={"q": "failed"}).text
        shown = re.search(r'data-testid="total">([^<]*)<', html)
        assert shown is not None and re.fullmatch(r"about \d+ messages", shown[1]), shown


def test_newest_messages_holding_the_words_less_often_widen_the_walk_not_collect_every_match(
    engine: sa.Engine,
) -> None:
    """The 300 oldest messages all say "broad", the 100 newest only one in ten: the first
    window of a walk, sized for the words' share of every message, holds no full page.
    A wider window finds it: every match is never collected (at 1,000,000 messages, 20,000
    newer ones saying "System.InvalidOperationException" less often made the API's broad
    search collect its 302,597 matches, 0.7 s, ``benchmarks/README.md``)."""
    older, newer = 300, 100
    attempts = [
        attempt(n, at(n), exception_message=f"failed broad number{n}") for n in range(older)
    ]
    attempts += [
        attempt(n, at(n), exception_message=f"failed {'broad' if n % 10 == 0 else 'other'}")
        for n in range(older, older + newer)
    ]
    FailedMessageBatchWriter(engine).write(IngestionBatch(attempts=attempts))
    if _estimates(engine):
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE failed_messages")
    newest_first = Ordering("time_of_failure")

    def search(exact_count_limit: int | None) -> SearchPage:
        with engine.connect() as conn:
            return search_failed_messages(
                conn,
                "broad",
                offset=0,
                limit=5,
                order=newest_first,
                exact_count_limit=exact_count_limit,
            )

    with _Counts(engine) as counts:
        found = search(LIMIT)
    expected = search(None)
    assert expected.total == older + newer // 10
    assert found.items == expected.items
    assert counts.collected == 0
    assert found.total_estimated


@pytest.mark.parametrize("path", ["/api/messages/search", "/api/endpoints/Sales/messages/search"])
def test_an_estimate_is_never_more_than_the_messages_the_search_is_among(
    clients: tuple[TestClient, TestClient],
    engine: sa.Engine,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
) -> None:
    """Breaker pass: on PostgreSQL with dead rows and no vacuum the planner estimated a
    search at 76,391 of 59,000 messages, and the Link header's last page was past every
    match. Where the database keeps the count of what the search is among (all messages,
    an endpoint's: the tallies), the estimate is capped by it. "rare" (the 60 oldest)
    leaves the broad search's window without a page: the search is estimated."""
    capped, _ = clients
    provider = type(provider_for(engine))
    monkeypatch.setattr(provider, "estimate_rows", lambda *_: 50 * MESSAGES)
    monkeypatch.setattr(provider, "estimate_search_hits", lambda *_: 50 * MESSAGES)

    answer = capped.get(path, params={"q": "rare", "per_page": "5"})

    assert answer.status_code == 200, answer.text
    assert int(answer.headers["Total-Count"]) <= MESSAGES
