"""Every list's sort by message type orders equal types by the stored attempt's time of
failure, then the id: ``(message_type, last_failure_at, id)``, all in the direction asked,
an empty type the smallest, on every provider (migration 0036).

The lists: every message, a status's, an endpoint's (with a status or not), a queue
address's, a group's (from its group rows, with a status or not, or joined to the
messages under another filter), a time range's, and a search's; each read page by page
(limit 4), from its filter's index or by walking the sort key's index
(``errors.read.lists.WALK_SORT_INDEX_PAST``), every row once. Some messages failed again
after they were stored, later than any other: the order is the stored attempt's time,
which the group rows carry a copy of.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa

from controlroom.db.tables import FailedMessageStatus, failed_message_groups, failed_messages
from controlroom.db.transactions import begin_write
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt, FailureGroup
from controlroom.errors.read import lists, operations
from controlroom.errors.read.filters import FailedMessageFilter, Ordering
from controlroom.errors.read.lists import list_failed_messages
from controlroom.errors.read.search import search_failed_messages
from tests.factories import at, attempt, message_uuid

MESSAGES = 36
TYPES = ("TypeB", "TypeA", None)
ENDPOINTS = ("Sales", "Billing")
GROUP = FailureGroup(id=str(uuid.uuid5(uuid.NAMESPACE_URL, "tiebreak")), classifier="T", title="g")
OTHER = FailureGroup(id=str(uuid.uuid5(uuid.NAMESPACE_URL, "other")), classifier="T", title="o")
FAILED_AGAIN = (2, 9, 31)  # a later attempt of these, stored after every first attempt
UNRESOLVED = frozenset({FailedMessageStatus.UNRESOLVED})
LISTS = {
    "every message": FailedMessageFilter(),
    "a status": FailedMessageFilter(statuses=UNRESOLVED),
    "all but a status": FailedMessageFilter(
        excluded_statuses=frozenset({FailedMessageStatus.ARCHIVED})
    ),
    "an endpoint": FailedMessageFilter(receiving_endpoint="Sales"),
    "an endpoint's status": FailedMessageFilter(receiving_endpoint="Sales", statuses=UNRESOLVED),
    "a queue address": FailedMessageFilter(queue_address="BILLING"),
    "a group": FailedMessageFilter(group_id=GROUP.id),
    "a group's status": FailedMessageFilter(group_id=GROUP.id, statuses=UNRESOLVED),
    "a group's endpoint": FailedMessageFilter(group_id=GROUP.id, receiving_endpoint="Billing"),
    "a time range": FailedMessageFilter(failed_from=at(60), failed_to=at(420)),
}
ORDERS = [Ordering("message_type", descending) for descending in (False, True)]


def failed_at(n: int) -> datetime:
    """Message ``n``'s first failure: out of the ids' order, every tenth minute shared
    (messages 30-35 share their type and time with 0-5: the id breaks those ties)."""
    return at(60 * ((n * 7) % 10))


def message(n: int, when: datetime) -> FailedAttempt:
    failure = attempt(n, when, endpoint=ENDPOINTS[n % 2], groups=(GROUP if n % 3 else OTHER,))
    return dataclasses.replace(failure, message_type=TYPES[n % 3])


@pytest.fixture
def stored(engine: sa.Engine) -> sa.Engine:
    """``MESSAGES`` messages of three types (one empty) over two endpoints and two groups;
    ``FAILED_AGAIN`` failed again later; every fourth archived."""
    writer = FailedMessageBatchWriter(engine, clock=lambda: at(10_000))
    writer.write(IngestionBatch(attempts=[message(n, failed_at(n)) for n in range(MESSAGES)]))
    again = [message(n, at(1_000 - n)) for n in FAILED_AGAIN]
    writer.write(IngestionBatch(attempts=again))
    with begin_write(engine) as conn:
        archived = [message_uuid(n) for n in range(0, MESSAGES, 4)]
        operations.archive_messages(conn, archived, at(20_000))
    return engine


def expected(engine: sa.Engine, where: FailedMessageFilter, order: Ordering) -> list[str]:
    """The ids of ``where``'s messages in ``order`` (type, stored attempt's failure, id),
    sorted here from the rows, with the group rows' copy of the failure time checked
    equal to the message's."""
    fm = failed_messages.c
    groups = failed_message_groups.c
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                fm.id,
                fm.message_type,
                fm.last_failure_at,
                fm.status,
                fm.receiving_endpoint,
                fm.queue_address,
                groups.group_id,
                groups.last_failure_at.label("copied"),
            ).join_from(failed_messages, failed_message_groups, groups.failed_message_id == fm.id)
        ).all()
    assert len(rows) == MESSAGES
    assert all(row.copied == row.last_failure_at for row in rows)
    again = {message_uuid(n) for n in FAILED_AGAIN}
    assert all((row.last_failure_at > at(900)) == (row.id in again) for row in rows)

    def kept(row: Any) -> bool:
        return all(
            (
                not where.statuses or row.status in where.statuses,
                row.status not in where.excluded_statuses,
                where.receiving_endpoint in (None, row.receiving_endpoint),
                where.queue_address is None
                or where.queue_address.lower() == row.queue_address.lower(),
                where.group_id in (None, row.group_id),
                where.failed_from is None or row.last_failure_at >= where.failed_from,
                where.failed_to is None or row.last_failure_at <= where.failed_to,
            )
        )

    def key(row: Any) -> tuple[Any, ...]:
        return (row.message_type is not None, row.message_type or "", row.last_failure_at, row.id)

    ordered = sorted((row for row in rows if kept(row)), key=key, reverse=order.descending)
    return [row.id for row in ordered]


def every_page(read: Callable[[int], list[str]], total: int) -> list[str]:
    """The ids of every page of 4 from the first, and of the page past the last (empty)."""
    ids: list[str] = []
    for offset in range(0, total + 4, 4):
        ids += read(offset)
    return ids


def check_paged(ids: list[str], wanted: list[str]) -> None:
    assert len(set(ids)) == len(ids), "a row on two pages"
    assert ids == wanted


@pytest.mark.parametrize("walked", [False, True], ids=["from-filter", "walked"])
@pytest.mark.parametrize("order", ORDERS, ids=["asc", "desc"])
@pytest.mark.parametrize("name", list(LISTS))
def test_a_lists_sort_by_message_type_orders_equal_types_by_time_of_failure(
    stored: sa.Engine,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    order: Ordering,
    walked: bool,
) -> None:
    if walked:
        monkeypatch.setattr(lists, "WALK_SORT_INDEX_PAST", -1)
    where = LISTS[name]
    wanted = expected(stored, where, order)
    assert len(wanted) >= 6 and len(set(wanted)) == len(wanted)

    def read(offset: int) -> list[str]:
        with stored.connect() as conn:
            page = list_failed_messages(conn, offset=offset, limit=4, where=where, order=order)
        assert page.total == len(wanted)
        return [item.id for item in page.items]

    check_paged(every_page(read, len(wanted)), wanted)


@pytest.mark.parametrize("exact_count_limit", [None, 2], ids=["collected", "walked"])
@pytest.mark.parametrize("order", ORDERS, ids=["asc", "desc"])
@pytest.mark.parametrize("name", ["every message", "a status", "an endpoint"])
def test_a_searchs_sort_by_message_type_orders_equal_types_by_time_of_failure(
    stored: sa.Engine, name: str, order: Ordering, exact_count_limit: int | None
) -> None:
    where = LISTS[name]
    wanted = expected(stored, where, order)

    def read(offset: int) -> list[str]:
        with stored.connect() as conn:
            page = search_failed_messages(
                conn,
                "failed",
                offset=offset,
                limit=4,
                where=where,
                order=order,
                exact_count_limit=exact_count_limit,
            )
        return [item.summary.id for item in page.items]

    check_paged(every_page(read, len(wanted)), wanted)


SUBSET = 300
OUTSIDE = 1_000
QUIET = FailureGroup(id=str(uuid.uuid5(uuid.NAMESPACE_URL, "quiet")), classifier="T", title="q")
BUSY = FailureGroup(id=str(uuid.uuid5(uuid.NAMESPACE_URL, "busy")), classifier="T", title="b")
GROUP_INDEX = "ix_failed_message_groups_group_id_message_type"
STATUS_INDEX = "ix_failed_messages_status_message_type_id"
ENDPOINT_INDEX = "ix_failed_messages_receiving_endpoint_message_type"
QUEUE_INDEX = "ix_failed_messages_queue_address_lower_message_type"
WALKS = {
    # a list, and the index its page by message type walks in order
    "a group": (FailedMessageFilter(group_id=QUIET.id), GROUP_INDEX),
    "a group's status": (FailedMessageFilter(group_id=QUIET.id, statuses=UNRESOLVED), GROUP_INDEX),
    "every message": (FailedMessageFilter(), STATUS_INDEX),
    "a status": (FailedMessageFilter(statuses=UNRESOLVED), STATUS_INDEX),
    "an endpoint": (FailedMessageFilter(receiving_endpoint="Quiet"), ENDPOINT_INDEX),
    "an endpoint's status": (
        FailedMessageFilter(receiving_endpoint="Quiet", statuses=UNRESOLVED),
        ENDPOINT_INDEX,
    ),
    "a queue address": (FailedMessageFilter(queue_address="QUIET"), QUEUE_INDEX),
}


@pytest.fixture
def walked_store(engine: sa.Engine) -> sa.Engine:
    """``OUTSIDE`` messages of endpoint Busy in group BUSY, then ``SUBSET`` of endpoint
    Quiet in group QUIET, of seven types, failing out of their ids' order; statistics
    refreshed and the pages all-visible on PostgreSQL, as autovacuum leaves them."""
    writer = FailedMessageBatchWriter(engine, clock=lambda: at(100_000))
    messages = [
        dataclasses.replace(
            attempt(
                n,
                at((n * 37) % 1_000),
                endpoint="Busy" if n < OUTSIDE else "Quiet",
                groups=(BUSY if n < OUTSIDE else QUIET,),
            ),
            message_type=f"Type{n % 7}",
        )
        for n in range(OUTSIDE + SUBSET)
    ]
    for start in range(0, len(messages), 500):
        writer.write(IngestionBatch(attempts=messages[start : start + 500]))
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE")
    return engine


def page_statement(
    engine: sa.Engine, where: FailedMessageFilter, order: Ordering
) -> tuple[str, Any]:
    """The statement (and its parameters) reading the first page's ids of ``where`` in
    ``order``, as a list of many matches reads them (``lists._page_ids``)."""
    ran: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        ran.append((statement, parameters))

    with engine.connect() as conn:
        page = lists._page_ids(conn, where, order, offset=0, limit=50, total=10**6)
        sa.event.listen(conn, "before_cursor_execute", record)
        conn.execute(sa.select(page.c.id)).all()
        sa.event.remove(conn, "before_cursor_execute", record)
    [found] = [(statement, parameters) for statement, parameters in ran if "LIMIT" in statement]
    return found


def postgresql_sorts_above(
    node: dict[str, Any], index: str, above: tuple[str, ...] = ()
) -> list[str] | None:
    """The sorts (``Sort``, ``Incremental Sort``) above the scans of ``index`` in
    PostgreSQL's plan ``node``; ``None`` when no node scans ``index``."""
    if node.get("Index Name") == index:
        return list(above)
    if node["Node Type"] in ("Sort", "Incremental Sort"):
        above = (*above, f"{node['Node Type']} by {', '.join(node['Sort Key'])}")
    found = [postgresql_sorts_above(child, index, above) for child in node.get("Plans", [])]
    scans = [sorts for sorts in found if sorts is not None]
    return None if not scans else [sort for sorts in scans for sort in sorts]


def sqlite_sorts_beside(plan: list[tuple[int, int, str]], index: str) -> list[str] | None:
    """The temporary b-trees sorting for an ``ORDER BY`` at the level (the parent) of the
    searches of ``index`` in SQLite's ``EXPLAIN QUERY PLAN`` rows (id, parent, detail);
    ``None`` when nothing searches ``index``."""
    parents = {parent for _, parent, detail in plan if f" INDEX {index} " in detail}
    if not parents:
        return None
    return [
        detail
        for _, parent, detail in plan
        if parent in parents and "TEMP B-TREE" in detail and "ORDER BY" in detail
    ]


def sorts_of_the_walk(
    engine: sa.Engine, where: FailedMessageFilter, order: Ordering, index: str
) -> list[str] | None:
    """What sorts the rows ``index`` gives in the plan of the first page's ids of
    ``where`` in ``order`` (``None``: the plan does not read ``index``)."""
    statement, parameters = page_statement(engine, where, order)
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            plan = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters)
            top = plan.scalar_one()
            return postgresql_sorts_above(top[0]["Plan"], index)
        rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
    return sqlite_sorts_beside([(int(r[0]), int(r[1]), str(r[3])) for r in rows], index)


@pytest.mark.parametrize("order", ORDERS, ids=["asc", "desc"])
@pytest.mark.parametrize("name", list(WALKS))
def test_a_lists_page_by_message_type_walks_its_index_in_order(
    walked_store: sa.Engine, name: str, order: Ordering
) -> None:
    """A page by message type of a group (its group rows), a status or every message (a
    walk per status, merged), an endpoint or a queue address (the walk of the types of at
    most ``INDEXED_TYPE_BYTES``, merged with the longer ones sorted) reads its index in
    the page's order, ``(key, message_type, last_failure_at, id)``: nothing sorts the
    rows the index gives (an index of ``(key, message_type, id)`` needs its equal types
    sorted again, PostgreSQL's ``Incremental Sort``, SQLite's "RIGHT PART OF ORDER BY")."""
    where, index = WALKS[name]
    sorts = sorts_of_the_walk(walked_store, where, order, index)
    assert sorts is not None, f"the page does not read {index}"
    assert sorts == []
