"""Searches past the exact-count limit against exact ones (break-it pass): every page a
capped search (``exact_count_limit`` small) answers holds the rows of an exact search
(no limit) over the same store; a total not marked estimated is the exact one, and a
search whose exact total is at most the limit is never marked estimated (README
"Estimated totals": exact up to the limit), whatever the text, filter, order and page.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailureGroup
from controlroom.errors.read import operations
from controlroom.errors.read.filters import EVERY_MESSAGE, FailedMessageFilter, Ordering
from controlroom.errors.read.search import search_failed_messages
from controlroom.errors.read.summaries import SearchPage
from tests.factories import at, attempt, message_uuid

LIMIT = 5
MESSAGES = 300
BOTH = 4
"""The newest ``BOTH`` messages say both "alpha" and "beta"; any other only one of them."""
GROUP = FailureGroup(id=str(uuid.UUID(int=999)), classifier="Test", title="gamma group")


def _text(n: int) -> str:
    word = "alpha" if n % 2 else "beta"
    if n >= MESSAGES - BOTH:
        word = "alpha beta"
    extra = " gamma" if n % 7 == 0 else ""
    return f"failed {word}{extra} number{n}"


@pytest.fixture
def store(engine: sa.Engine) -> Iterator[sa.Engine]:
    """``MESSAGES`` messages; every fifth archived; every seventh also in ``GROUP``;
    statistics up to date."""
    attempts = []
    for n in range(MESSAGES):
        text = _text(n)
        own = FailureGroup(id=str(uuid.uuid5(uuid.NAMESPACE_URL, text)), classifier="T", title=text)
        groups = (own, GROUP) if n % 7 == 0 else (own,)
        endpoint = "Billing" if n % 3 == 0 else "Sales"
        attempts.append(attempt(n, at(n), exception_message=text, endpoint=endpoint, groups=groups))
    FailedMessageBatchWriter(engine).write(IngestionBatch(attempts=attempts))
    with engine.begin() as conn:
        archived = [message_uuid(n) for n in range(0, MESSAGES, 5)]
        operations.archive_messages(conn, archived, at(10_000))
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE failed_messages")
            conn.exec_driver_sql("ANALYZE failed_message_groups")
    yield engine


def _search(
    engine: sa.Engine,
    text: str,
    *,
    offset: int,
    limit: int,
    where: FailedMessageFilter,
    order: Ordering,
    exact_count_limit: int | None,
) -> SearchPage:
    with engine.connect() as conn:
        return search_failed_messages(
            conn,
            text,
            offset=offset,
            limit=limit,
            where=where,
            order=order,
            exact_count_limit=exact_count_limit,
        )


def test_few_co_occurrences_at_the_head_are_counted_exactly(store: sa.Engine) -> None:
    """ "alpha beta" occurs together in 4 messages (at most the limit of 5), all at the
    head of the default order. The planner takes the words for independent (about a
    quarter of 300 = 75 >= 5 x 5), and the window of a one-row page holds a full page;
    the sample of the messages says few, so the search is counted: 4, exact."""
    order = Ordering()
    capped = _search(
        store,
        "alpha beta",
        offset=0,
        limit=1,
        where=EVERY_MESSAGE,
        order=order,
        exact_count_limit=LIMIT,
    )
    assert [hit.summary.id for hit in capped.items] == [message_uuid(MESSAGES - 1)]
    assert (capped.total, capped.total_estimated) == (BOTH, False)


QUERIES = [
    "alpha beta",
    "alpha",
    "beta gamma",
    "failed",
    '"',
    "NEAR(alpha beta)",
    "alph*",
    "body:alpha",
    "alpha OR beta",
    "\x00alpha",
    "alpha " + "x" * 5000,
    "msg-7 gamma",
    message_uuid(14),
    "   ",
]
FILTERS = {
    "every": EVERY_MESSAGE,
    "unresolved": FailedMessageFilter(statuses=frozenset({FailedMessageStatus.UNRESOLVED})),
    "sales": FailedMessageFilter(receiving_endpoint="Sales"),
    "group": FailedMessageFilter(group_id=GROUP.id),
}
ORDERS = [Ordering(), Ordering(key="time_of_failure", descending=False)]


@pytest.mark.parametrize("filter_name", list(FILTERS))
def test_capped_searches_page_as_exact_ones(store: sa.Engine, filter_name: str) -> None:
    """Every page of a capped search holds the exact search's rows; a total not marked
    estimated is exact; an exact total within the limit is never marked estimated; no
    error on any text."""
    where = FILTERS[filter_name]
    problems: list[str] = []
    for text in QUERIES:
        for order in ORDERS:
            for per_page in (1, 4):
                exact_total = None
                offset = 0
                pages = 0
                while True:
                    args = {"offset": offset, "limit": per_page, "where": where, "order": order}
                    exact = _search(store, text, exact_count_limit=None, **args)
                    capped = _search(store, text, exact_count_limit=LIMIT, **args)
                    exact_total = exact.total
                    label = f"{text[:30]!r} {order} per_page={per_page} offset={offset}"
                    exact_ids = [hit.summary.id for hit in exact.items]
                    capped_ids = [hit.summary.id for hit in capped.items]
                    if capped_ids != exact_ids:
                        problems.append(f"{label}: rows {capped_ids} != {exact_ids}")
                    if not capped.total_estimated and capped.total != exact_total:
                        problems.append(f"{label}: exact total {capped.total} != {exact_total}")
                    if exact_total <= LIMIT and capped.total_estimated:
                        problems.append(
                            f"{label}: {exact_total} matches answered as estimate {capped.total}"
                        )
                    if capped.total_estimated and capped.total <= LIMIT:
                        problems.append(f"{label}: estimate {capped.total} within the limit")
                    pages += 1
                    offset += per_page
                    if offset > exact_total or pages > 3:
                        break
                # The last page and one past it.
                for last in (max(exact_total - 1, 0) // per_page * per_page, exact_total + 3):
                    args = {"offset": last, "limit": per_page, "where": where, "order": order}
                    exact = _search(store, text, exact_count_limit=None, **args)
                    capped = _search(store, text, exact_count_limit=LIMIT, **args)
                    if [h.summary.id for h in capped.items] != [h.summary.id for h in exact.items]:
                        problems.append(f"{text[:30]!r} {order} offset={last}: rows differ")
    assert problems == [], "\n".join(problems[:40]) + f"\n({len(problems)} problems)"
