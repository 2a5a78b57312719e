"""A list or search page is the same whichever way the store finds it, and on SQLite a
page of many matches walks the sort key's index (``errors.read.lists.WALK_SORT_INDEX_PAST``
for lists, the exact-count limit for searches).

SQLite keeps no statistics: given an equality on an indexed column (status, endpoint,
queue address) it reads every match from that column's index and sorts them all, 700,000
rows for the Unresolved of 1,000,000 (``benchmarks/README.md``, SQLite at a million).
Past ``WALK_SORT_INDEX_PAST`` matches the page keeps those columns from every index
(``Provider.without_index``), so the sort key's index is walked and filtered instead. A
search of more matches than the exact-count limit is walked the same way (it was only
where the total is an estimate, never on SQLite, which counts exactly).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.providers import SearchQuery, SearchTerms
from controlroom.db.providers import sqlite as sqlite_provider
from controlroom.db.tables import FailedMessageStatus
from controlroom.db.transactions import begin_write
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.read import lists, operations
from controlroom.errors.read.filters import FailedMessageFilter, Ordering, filter_conditions
from controlroom.errors.read.lists import list_failed_messages
from controlroom.errors.read.search import search_failed_messages
from controlroom.errors.read.summaries import SearchPage
from tests.factories import at, attempt, message_uuid

UNRESOLVED = frozenset({FailedMessageStatus.UNRESOLVED})
ENDPOINTS = ("Sales", "Billing", "Shipping")
MESSAGES = 30

FILTERS = [
    FailedMessageFilter(statuses=UNRESOLVED),
    FailedMessageFilter(statuses=frozenset({FailedMessageStatus.ARCHIVED})),
    FailedMessageFilter(excluded_statuses=frozenset({FailedMessageStatus.ARCHIVED})),
    FailedMessageFilter(receiving_endpoint="Sales"),
    FailedMessageFilter(queue_address="BILLING"),
    FailedMessageFilter(statuses=UNRESOLVED, receiving_endpoint="Shipping"),
]
ORDERS = [
    Ordering(),
    Ordering("time_of_failure"),
    Ordering("modified", descending=False),
    Ordering("message_type", descending=False),
    Ordering("status"),
]


def fill(engine: sa.Engine) -> sa.Engine:
    """``engine`` with ``MESSAGES`` messages over three endpoints, failing out of order,
    every fourth archived."""
    writer = FailedMessageBatchWriter(engine, clock=lambda: at(10_000))
    writer.write(
        IngestionBatch(
            attempts=[
                attempt(n, at((n * 7) % MESSAGES), endpoint=ENDPOINTS[n % 3])
                for n in range(MESSAGES)
            ]
        )
    )
    with begin_write(engine) as conn:
        archived = [message_uuid(n) for n in range(0, MESSAGES, 4)]
        operations.archive_messages(conn, archived, at(20_000))
    return engine


@pytest.fixture
def stored(engine: sa.Engine) -> sa.Engine:
    """``fill`` on each provider."""
    return fill(engine)


@pytest.fixture
def sqlite_stored(tmp_path: Path) -> Iterator[sa.Engine]:
    """``fill`` on SQLite alone: the plan below is SQLite's (PostgreSQL chooses from
    its statistics)."""
    engine = create_store_engine(f"sqlite:///{tmp_path / 'controlroom.db'}")
    upgrade_database(engine)
    yield fill(engine)
    engine.dispose()


def pages(engine: sa.Engine, where: FailedMessageFilter, order: Ordering) -> Any:
    with engine.connect() as conn:
        return [
            list_failed_messages(conn, offset=offset, limit=4, where=where, order=order)
            for offset in (0, 4, 8, 40)
        ]


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: f"{o.key}-{o.descending}")
def test_a_page_is_the_same_walked_or_read_from_its_filter(
    stored: sa.Engine, monkeypatch: pytest.MonkeyPatch, order: Ordering
) -> None:
    """Every filter's pages, read from the filter's index and sorted or found by walking
    the sort key's index (every match counts as many): the same rows, order and totals."""
    from_filter = [pages(stored, where, order) for where in FILTERS]
    monkeypatch.setattr(lists, "WALK_SORT_INDEX_PAST", -1)
    walked = [pages(stored, where, order) for where in FILTERS]

    assert walked == from_filter
    totals = [filter_pages[0].total for filter_pages in from_filter]
    assert totals == [22, 8, 22, 10, 10, 8]
    assert all(len(filter_pages[0].items) == 4 for filter_pages in from_filter)


@pytest.fixture
def statements(sqlite_stored: sa.Engine) -> Iterator[list[tuple[str, Any]]]:
    """The statements ``sqlite_stored`` runs while the test runs, with their parameters."""
    ran: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        ran.append((statement, parameters))

    sa.event.listen(sqlite_stored, "before_cursor_execute", record)
    yield ran
    sa.event.remove(sqlite_stored, "before_cursor_execute", record)


def sqlite_plan(engine: sa.Engine, statement: str, parameters: Any) -> list[str]:
    with engine.connect() as conn:
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        rows = cursor.execute("EXPLAIN QUERY PLAN " + statement, parameters).fetchall()
        cursor.close()
    return [str(row[-1]) for row in rows]


@pytest.mark.parametrize(
    ("where", "index", "total"),
    [
        (
            FailedMessageFilter(statuses=UNRESOLVED),
            "ix_failed_messages_status_last_failure_at_id",
            22,
        ),
        (
            FailedMessageFilter(statuses=UNRESOLVED, receiving_endpoint="Sales"),
            "ix_failed_messages_receiving_endpoint_last_failure_at",
            7,
        ),
    ],
    ids=["status", "status-and-endpoint"],
)
def test_sqlite_walks_the_sort_keys_index_for_many_matches(
    sqlite_stored: sa.Engine,
    statements: list[tuple[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    where: FailedMessageFilter,
    index: str,
    total: int,
) -> None:
    """Past ``WALK_SORT_INDEX_PAST`` matches, a page filtered by status is read along the
    status's own index of the sort key (migration 0024), not from the status index and
    sorted; an endpoint's along its own
    index of the sort key (migration 0020), never the status index."""
    monkeypatch.setattr(lists, "WALK_SORT_INDEX_PAST", 5)
    with sqlite_stored.connect() as conn:
        page = list_failed_messages(
            conn, offset=0, limit=4, where=where, order=Ordering("time_of_failure")
        )
    assert page.total == total

    [(statement, parameters)] = [s for s in statements if "LIMIT" in s[0]]
    plan = sqlite_plan(sqlite_stored, statement, parameters)
    assert any(f"INDEX {index} " in f"{line} " for line in plan), plan
    assert not any("USING" in line and index not in line for line in plan[:-2]), plan
    assert not any("TEMP B-TREE" in line for line in plan[:-1]), plan


SEARCHES = ("failed", "Sales", "msg-4", "failed Billing")


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: f"{o.key}-{o.descending}")
def test_a_search_page_is_the_same_walked_or_collected(stored: sa.Engine, order: Ordering) -> None:
    """Past the exact-count limit a search page is found by walking the sort key's index
    (on SQLite against the hits within the walked rows' rowid range); within it from the
    collected matches: the same rows in the same order. The total is an estimate past
    the limit on every provider, the exact total within it."""

    def search(text: str, offset: int, exact_count_limit: int | None) -> SearchPage:
        with stored.connect() as conn:
            return search_failed_messages(
                conn,
                text,
                offset=offset,
                limit=4,
                order=order,
                exact_count_limit=exact_count_limit,
            )

    estimated = 0
    for text in SEARCHES:
        for offset in (0, 4, 28):
            collected = search(text, offset, None)
            walked = search(text, offset, 2)
            assert walked.items == collected.items
            # An estimate only past the limit; a total not marked is exact (a short
            # page, or matches collected with the page, are counted).
            if walked.total_estimated:
                assert collected.total > 2 and walked.total >= 3
                estimated += 1
            else:
                assert walked.total == collected.total
            if collected.total <= 2:
                assert not walked.total_estimated
    assert estimated > 0
    assert [search(text, 0, None).total for text in SEARCHES] == [30, 10, 1, 10]


@pytest.mark.parametrize("offset", [0, 600])
def test_sqlite_walks_the_sort_keys_index_for_a_search_of_many_matches(
    sqlite_stored: sa.Engine, statements: list[tuple[str, Any]], offset: int
) -> None:
    """A search of more matches than the exact-count limit reads its page along the sort
    key's index, testing each row, not from the full-text and id indexes and sorted. The
    walk is bounded (``_search_page_of_many``): it tests each row against the hits FTS5
    has within the walked rows' rowid range, read once (a lookup in FTS5 per row cost
    0.3 ms, 150 ms for the 490 rows of a broad search's first page at 1,000,000
    messages; the hits of the range 1 ms, ``benchmarks/README.md``). Past the end
    (offset 600), where a walk would pass more rows than the search matches, the page
    is read from the collected matches, with their exact count, and nothing walks."""
    with sqlite_stored.connect() as conn:
        page = search_failed_messages(conn, "failed", offset=offset, limit=4, exact_count_limit=5)
    assert page.total_estimated == (offset == 0)
    assert len(page.items) == (4 if offset == 0 else 0)
    assert page.total_estimated or page.total == MESSAGES
    walked = any(") AS window" in statement for statement, _ in statements)
    assert walked == (offset == 0), statements
    if offset:
        return

    (statement, parameters) = next(s for s in statements if "LIMIT ? OFFSET ?) AS page" in s[0])
    plan = sqlite_plan(sqlite_stored, statement, parameters)
    assert any(
        line.startswith("SEARCH failed_messages USING")
        and "ix_failed_messages_status_time_sent_id (status=?)" in line
        for line in plan
    ), plan
    assert not any("MULTI-INDEX OR" in line or "TEMP B-TREE" in line for line in plan[:3])
    assert not any("CORRELATED" in line for line in plan), plan
    assert any("LIST SUBQUERY" in line for line in plan), plan
    [hits] = [line for line in plan if line.startswith("SCAN failed_messages_fts VIRTUAL")]
    constraints = hits.rpartition(":")[2]
    assert "M" in constraints and "<" in constraints and ">" in constraints, hits


def test_sqlite_estimates_a_search_from_fts5_without_scanning_the_table(
    sqlite_stored: sa.Engine, statements: list[tuple[str, Any]]
) -> None:
    """The estimate of a search's hits samples FTS5 and reads the table's rowid range
    from its two ends: no statement scans failed_messages (a min() and a max() in one
    statement scanned it, 0.3-0.6 s at 1,000,000 messages)."""
    with sqlite_stored.connect() as conn:
        estimate = sqlite_provider.PROVIDER.estimate_search_hits(
            conn, SearchQuery((SearchTerms(("failed",)),))
        )
        assert (
            sqlite_provider.PROVIDER.estimate_search_hits(
                conn, SearchQuery((SearchTerms(("nowhere",)),))
            )
            == 0
        )
    assert estimate == MESSAGES  # every message holds "failed": every sampled rowid hits
    plans = [sqlite_plan(sqlite_stored, *ran) for ran in statements if "SELECT" in ran[0]]
    assert plans
    assert not any(line.startswith("SCAN failed_messages ") for plan in plans for line in plan)


def test_sqlite_estimates_a_search_within_a_status_by_looking_up_sampled_hits(
    sqlite_stored: sa.Engine, statements: list[tuple[str, Any]]
) -> None:
    """With a filter, the sampled hits' rows are looked up by rowid and tested: never a
    scan of failed_messages, nor the status's index read whole (SQLite, without
    statistics, took the status index for 200,000 of 1,000,000 rows, 85 ms, where the
    lookups of 2,000 sampled hits took 3 ms)."""
    where = filter_conditions(FailedMessageFilter(statuses=UNRESOLVED))
    with sqlite_stored.connect() as conn:
        estimate = sqlite_provider.PROVIDER.estimate_search_hits(
            conn, SearchQuery((SearchTerms(("failed",)),)), where
        )
    assert 0 < estimate <= 2 * MESSAGES  # 8 windows of one rowid each: a sample
    plans = [sqlite_plan(sqlite_stored, *ran) for ran in statements if "SELECT" in ran[0]]
    assert any("failed_messages.rowid IN" in ran[0] for ran in statements)
    for plan in plans:
        assert not any(line.startswith("SCAN failed_messages ") for line in plan), plan
        assert not any("INDEX ix_failed_messages_status" in line for line in plan), plan


def test_a_search_within_the_limit_reads_its_matches_once(stored: sa.Engine) -> None:
    """A search of at most ``exact_count_limit`` matches is answered by one statement
    that tests the rows (its page and exact total from the collected matches): counting
    them first, up to the limit, read the same matches twice (PostgreSQL: the GIN bitmap
    and every match's row, 15-30 ms each for 4,000-7,700 matches at 1,000,000,
    ``benchmarks/plans/postgresql-1m.txt``). SQLite's count in FTS5 alone reads no row."""
    ran: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        ran.append(statement)

    # The full-text condition as each provider writes it against failed_messages' rows.
    tests_rows = "@@" if stored.dialect.name == "postgresql" else "failed_messages.rowid IN"
    sa.event.listen(stored, "before_cursor_execute", record)
    try:
        with stored.connect() as conn:
            page = search_failed_messages(conn, "Sales", offset=0, limit=4, exact_count_limit=20)
    finally:
        sa.event.remove(stored, "before_cursor_execute", record)
    assert (page.total, page.total_estimated, len(page.items)) == (10, False, 4)
    reads = [s for s in ran if tests_rows in s and not s.startswith("EXPLAIN")]  # plans read none
    assert len(reads) == 1, reads
