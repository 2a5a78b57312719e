"""A subset's first page reads the rows of that subset, never rows outside it.

docs/design.md "Reads at scale": a group, an endpoint, a queue address, a status or a
search whose messages stopped failing is opened after new failures elsewhere (or after
many newer messages left its status); its first page, in every sort key and direction,
must cost what it cost before they arrived. Checked on the work the store reports, never on a time:
PostgreSQL's tuples read in this transaction by scans of tables and indexes
(``pg_stat_get_xact_tuples_returned``), SQLite's virtual-machine steps (a progress
handler). The page sizes are
shrunk (``WALK_SORT_INDEX_PAST``) so a subset of a few hundred takes the path of a subset
of hundreds of thousands.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa

from controlroom.db.tables import FailedMessageStatus
from controlroom.errors import tallies
from controlroom.errors.ingest.identity import unique_message_id
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt, FailureGroup
from controlroom.errors.read import lists, search
from controlroom.errors.read.counts import count_matching
from controlroom.errors.read.filters import SORT_KEYS, FailedMessageFilter, Ordering
from tests.factories import at, attempt

SUBSET = 300
OUTSIDE = 6_000
BATCH = 500
QUIET = FailureGroup(id=str(uuid.uuid5(uuid.NAMESPACE_URL, "quiet")), classifier="T", title="q")
BUSY = FailureGroup(id=str(uuid.uuid5(uuid.NAMESPACE_URL, "busy")), classifier="T", title="b")
SUBSETS = {
    "group": FailedMessageFilter(group_id=QUIET.id),
    "unresolved of a group": FailedMessageFilter(
        group_id=QUIET.id, statuses=frozenset({FailedMessageStatus.UNRESOLVED})
    ),
    "endpoint": FailedMessageFilter(receiving_endpoint="Quiet"),
    "unresolved of an endpoint": FailedMessageFilter(
        receiving_endpoint="Quiet", statuses=frozenset({FailedMessageStatus.UNRESOLVED})
    ),
    "queue address": FailedMessageFilter(queue_address="quiet"),
    "unresolved of a queue address": FailedMessageFilter(
        queue_address="quiet", statuses=frozenset({FailedMessageStatus.UNRESOLVED})
    ),
    "archived": FailedMessageFilter(statuses=frozenset({FailedMessageStatus.ARCHIVED})),
    "resolved": FailedMessageFilter(statuses=frozenset({FailedMessageStatus.RESOLVED})),
    "resolved or archived": FailedMessageFilter(
        statuses=frozenset({FailedMessageStatus.RESOLVED, FailedMessageStatus.ARCHIVED})
    ),
    "not unresolved": FailedMessageFilter(
        excluded_statuses=frozenset({FailedMessageStatus.UNRESOLVED})
    ),
}
STATUSES_AFTER_RESOLVED = {
    # The rows outside arrive, then are resolved: most rows are resolved, the unresolved
    # (and the archived) are few and older.
    "unresolved": FailedMessageFilter(statuses=frozenset({FailedMessageStatus.UNRESOLVED})),
    "archived": FailedMessageFilter(statuses=frozenset({FailedMessageStatus.ARCHIVED})),
    "not resolved": FailedMessageFilter(
        excluded_statuses=frozenset({FailedMessageStatus.RESOLVED})
    ),
}
SEARCHES = {
    # (text, filter): a search matching a few of the quiet messages, one matching all of
    # them (past the exact-count limit of ``search_page_work``), one within a status.
    "search of a few": ("rare", FailedMessageFilter()),
    "search of many": ("quietly", FailedMessageFilter()),
    "search of many resolved": (
        "quietly",
        FailedMessageFilter(statuses=frozenset({FailedMessageStatus.RESOLVED})),
    ),
}
SEARCH_COUNT_LIMIT = 100
GROWN_BY = 10
SUBSET_SORTS = {
    # The sorts of each subset a client opens it in, which must cost a page: ServicePulse's
    # of a group's messages (time of failure, message type; time sent before), the time
    # sorts of an endpoint and of a queue address, with a status (ServicePulse's and the
    # console's view of an endpoint's failures) or without. A queue address's total is
    # counted through its rows (exact on SQLite past the limit too, which has no
    # estimate), reading every row of it: its page is measured without its count.
    "group": ("time_sent", "time_of_failure", "message_type"),
    "unresolved of a group": ("time_sent", "time_of_failure", "message_type"),
    "endpoint": ("time_sent", "time_of_failure", "message_type"),
    "unresolved of an endpoint": ("time_sent", "time_of_failure", "message_type"),
    "queue address": ("time_sent", "time_of_failure", "message_type"),
    "unresolved of a queue address": ("time_sent", "time_of_failure", "message_type"),
}
COUNTED_THROUGH_ROWS = {"queue address", "unresolved of a queue address"}
FENCED_SORTS = {
    # The sorts of a subset read from its rows and sorted, whose keys the subset's index
    # includes (migration 0031): the console's, not ServicePulse's (those walk an index).
    "group": ("modified", "status", "id"),
    "unresolved of a group": ("modified", "status", "id"),
    "endpoint": ("modified", "status", "id"),
    "unresolved of an endpoint": ("modified", "status", "id"),
    "queue address": ("modified", "status", "id"),
    "unresolved of a queue address": ("modified", "status", "id"),
}
ORDERS = [Ordering(key, descending) for key in SORT_KEYS for descending in (True, False)]
GROWTH = 1.5  # work after the outside rows / work before, at most


def message(n: int, endpoint: str, group: FailureGroup) -> FailedAttempt:
    """Message ``n`` of ``endpoint`` in ``group``, sent and failed at second ``n``; the
    quiet group's say "quietly", every thirtieth "rare" too. Its id is the service's, a
    digest of its message id and endpoint: the first ids are a random sample, as a broad
    search's sample takes them (sequential ids would put every quiet message in it)."""
    sent = at(n)
    said = None
    if group is QUIET:
        said = f"failed quietly {n}" + (" rare" if n % 30 == 0 else "")
    failure = attempt(
        n, sent + timedelta(seconds=1), exception_message=said, endpoint=endpoint, groups=(group,)
    )
    return dataclasses.replace(
        failure,
        unique_message_id=unique_message_id(failure.headers),
        time_sent=sent,
        message_type=f"Type{n % 7}",
    )


def write(engine: sa.Engine, messages: list[FailedAttempt], clock_seconds: int) -> None:
    writer = FailedMessageBatchWriter(engine, clock=lambda: at(clock_seconds))
    for start in range(0, len(messages), BATCH):
        writer.write(IngestionBatch(attempts=messages[start : start + BATCH]))


def work_counter(conn: sa.Connection) -> Callable[[], int]:
    """A function giving the work ``conn``'s store has done so far in this transaction:
    tuples read by scans of tables and indexes (PostgreSQL), or hundreds of
    virtual-machine steps (SQLite)."""
    if conn.dialect.name == "postgresql":
        tuples = sa.text(
            "SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'i') AND n.nspname NOT LIKE 'pg\\_%' "
            "AND n.nspname <> 'information_schema'"
        )
        return lambda: int(conn.execute(tuples).scalar_one())
    steps = [0]

    def step() -> int:
        steps[0] += 1
        return 0

    conn.connection.driver_connection.set_progress_handler(step, 100)  # type: ignore[union-attr]
    return lambda: steps[0]


def first_page_work(
    engine: sa.Engine,
    where: FailedMessageFilter,
    order: Ordering,
    exact_count_limit: int | None = None,
    *,
    counted: bool = True,
) -> int:
    """The work of reading the first page of ``where`` in ``order`` (and its total, exact
    up to ``exact_count_limit``, always exact by default; without the work of counting
    it unless ``counted``)."""
    with engine.connect() as conn:
        counter = work_counter(conn)
        before = counter()
        if not counted:  # the count's work, measured on its own and taken off
            count_matching(conn, where, exact_count_limit)
            counting = counter() - before
            before = counter() + counting
        page = lists.list_failed_messages(
            conn,
            offset=0,
            limit=50,
            where=where,
            order=order,
            exact_count_limit=exact_count_limit,
        )
        work = counter() - before
    assert page.items, (where, order)
    return work


def search_page_work(
    engine: sa.Engine, text: str, where: FailedMessageFilter, order: Ordering
) -> int:
    """The work of reading the first page of a search of ``text`` among ``where`` in
    ``order`` (and its total, exact up to ``SEARCH_COUNT_LIMIT``)."""
    with engine.connect() as conn:
        counter = work_counter(conn)
        before = counter()
        page = search.search_failed_messages(
            conn,
            text,
            offset=0,
            limit=50,
            order=order,
            where=where,
            exact_count_limit=SEARCH_COUNT_LIMIT,
        )
        work = counter() - before
    assert page.items, (text, where, order)
    return work


def grown_work(
    before: dict[tuple[str, Ordering], int], measure: Callable[[str, Ordering], int]
) -> dict[str, tuple[int, int]]:
    """The pages whose work ``measure`` now gives grew past ``GROWTH`` x ``before``."""
    grown = {}
    for (name, order), was in before.items():
        now = measure(name, order)
        if now > GROWTH * was + 50:
            grown[f"{name} by {order.key} {'desc' if order.descending else 'asc'}"] = (was, now)
    return grown


def analyze(engine: sa.Engine, *, vacuum: bool = False) -> None:
    """PostgreSQL's statistics refreshed, with ``vacuum`` its dead rows vacuumed too, as its
    autovacuum would (index entries of rows that changed status are otherwise read until
    vacuumed); SQLite keeps no statistics in production (nothing runs its ``ANALYZE``),
    so none here."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                "VACUUM ANALYZE" if vacuum else "ANALYZE"
            )


@pytest.fixture
def quiet_store(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[sa.Engine]:
    """``SUBSET`` messages of endpoint Quiet in group QUIET, sent and failed before any
    other; every tenth archived, four in ten resolved. Lists of more than 100 matches take
    their large path."""
    monkeypatch.setattr(lists, "WALK_SORT_INDEX_PAST", 100)
    write(engine, [message(n, "Quiet", QUIET) for n in range(SUBSET)], clock_seconds=SUBSET)
    archive_and_resolve(engine)
    analyze(engine)
    yield engine


def archive_and_resolve(engine: sa.Engine) -> None:
    """Every tenth message archived, four in ten resolved (by the last digit of the
    message id), the others left as they are."""
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE failed_messages SET status = :archived WHERE message_id LIKE '%0'"),
            {"archived": int(FailedMessageStatus.ARCHIVED)},
        )
        for digit in "1234":
            conn.execute(
                sa.text(
                    "UPDATE failed_messages SET status = :resolved "
                    f"WHERE message_id LIKE '%{digit}'"
                ),
                {"resolved": int(FailedMessageStatus.RESOLVED)},
            )


def test_a_subsets_first_page_reads_no_rows_outside_it(quiet_store: sa.Engine) -> None:
    before = {
        (name, order): first_page_work(quiet_store, where, order)
        for name, where in SUBSETS.items()
        for order in ORDERS
    }
    busy = [message(n, "Busy", BUSY) for n in range(SUBSET, SUBSET + OUTSIDE)]
    write(quiet_store, busy, clock_seconds=SUBSET + OUTSIDE)
    analyze(quiet_store)
    grown = grown_work(
        before, lambda name, order: first_page_work(quiet_store, SUBSETS[name], order)
    )
    assert not grown, f"work before -> after {OUTSIDE} rows outside the subset: {grown}"


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_subsets_first_page_reads_no_rows_outside_it_once_vacuumed(
    quiet_store: sa.Engine,
) -> None:
    """As above once ``VACUUM`` has marked the pages all-visible, as autovacuum does (an
    index-only scan is then cheap enough to be taken where it reads every message: a
    queue address's exact count read the plain ``queue_address`` index whole). SQLite's
    plans do not depend on a vacuum: the test above covers it."""
    analyze(quiet_store, vacuum=True)
    before = {
        (name, order): first_page_work(quiet_store, where, order)
        for name, where in SUBSETS.items()
        for order in ORDERS
    }
    busy = [message(n, "Busy", BUSY) for n in range(SUBSET, SUBSET + OUTSIDE)]
    write(quiet_store, busy, clock_seconds=SUBSET + OUTSIDE)
    analyze(quiet_store, vacuum=True)
    grown = grown_work(
        before, lambda name, order: first_page_work(quiet_store, SUBSETS[name], order)
    )
    assert not grown, f"work before -> after {OUTSIDE} rows outside the subset: {grown}"


def test_a_subsets_first_page_in_servicepulses_sorts_costs_a_page_not_the_subset(
    quiet_store: sa.Engine,
) -> None:
    """A group's first page by ServicePulse's sorts of a group's messages (time of failure,
    message type, and time sent, its former default) and an endpoint's and a queue
    address's by their time sorts, in a status or in any, read about a page of rows
    however big the subset: ten times the messages in it, the same work. Grown, the
    subset is a third of the table and half of its messages Unresolved, as half of the
    newer messages outside it are: a planner taking the endpoint and the status for
    independent then prefers the status's index, passing those newer ones. Totals as the
    API counts them (exact up to a limit): a group's and an endpoint's come from the
    counts the database keeps, a queue address's is left out. The other sorts of a subset
    read it whole and sort it (docs/decisions.md "A subset is read from its own rows").
    Rows outside the subset come first, so the subset is a part of the table as it is in
    production (a table of the subset alone is small enough that PostgreSQL joins the
    page's ids to a scan of all of it); the tallies' deltas are folded before each
    measurement, as the writer folds them (unfolded, an endpoint's count reads them)."""
    busy = [message(n, "Busy", BUSY) for n in range(SUBSET * GROWN_BY, SUBSET * GROWN_BY + OUTSIDE)]
    write(quiet_store, busy, clock_seconds=SUBSET * GROWN_BY + OUTSIDE)
    tallies.fold_deltas(quiet_store)
    analyze(quiet_store, vacuum=True)

    def measure(name: str, order: Ordering) -> int:
        return first_page_work(
            quiet_store,
            SUBSETS[name],
            order,
            exact_count_limit=SEARCH_COUNT_LIMIT,
            counted=name not in COUNTED_THROUGH_ROWS,
        )

    before = {
        (name, order): measure(name, order)
        for name, keys in SUBSET_SORTS.items()
        for order in ORDERS
        if order.key in keys
    }
    more = [message(n, "Quiet", QUIET) for n in range(SUBSET, SUBSET * GROWN_BY)]
    write(quiet_store, more, clock_seconds=SUBSET * GROWN_BY)
    archive_and_resolve(quiet_store)
    tallies.fold_deltas(quiet_store)
    analyze(quiet_store, vacuum=True)
    grown = grown_work(before, measure)
    assert not grown, f"work before -> after {GROWN_BY} x the messages in the subset: {grown}"


def test_a_statuss_first_page_reads_no_rows_of_other_statuses(quiet_store: sa.Engine) -> None:
    before = {
        (name, order): first_page_work(quiet_store, where, order)
        for name, where in STATUSES_AFTER_RESOLVED.items()
        for order in ORDERS
    }
    busy = [message(n, "Busy", BUSY) for n in range(SUBSET, SUBSET + OUTSIDE)]
    write(quiet_store, busy, clock_seconds=SUBSET + OUTSIDE)
    with quiet_store.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE failed_messages SET status = :resolved WHERE receiving_endpoint = 'Busy'"
            ),
            {"resolved": int(FailedMessageStatus.RESOLVED)},
        )
    analyze(quiet_store, vacuum=True)
    grown = grown_work(
        before,
        lambda name, order: first_page_work(quiet_store, STATUSES_AFTER_RESOLVED[name], order),
    )
    assert not grown, f"work before -> after {OUTSIDE} newer resolved rows: {grown}"


def test_a_searchs_first_page_reads_no_rows_it_does_not_match(quiet_store: sa.Engine) -> None:
    def measure(name: str, order: Ordering) -> int:
        text, where = SEARCHES[name]
        return search_page_work(quiet_store, text, where, order)

    before = {(name, order): measure(name, order) for name in SEARCHES for order in ORDERS}
    busy = [message(n, "Busy", BUSY) for n in range(SUBSET, SUBSET + OUTSIDE)]
    write(quiet_store, busy, clock_seconds=SUBSET + OUTSIDE)
    analyze(quiet_store)
    grown = grown_work(before, measure)
    assert not grown, f"work before -> after {OUTSIDE} rows the search does not match: {grown}"


def fenced_statement(
    conn: sa.Connection, where: FailedMessageFilter, order: Ordering, offset: int = 0
) -> tuple[str, object]:
    """The statement (and its parameters) of the page of ``where`` in ``order`` from
    ``offset`` that reads the subset fenced (``Provider.fenced``, as ``members``)."""
    statements: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        statements.append((statement, parameters))

    sa.event.listen(conn, "before_cursor_execute", record)
    lists.list_failed_messages(conn, offset=offset, limit=50, where=where, order=order)
    sa.event.remove(conn, "before_cursor_execute", record)
    fenced = [(s, p) for s, p in statements if "members" in s]
    assert len(fenced) == 1, statements
    return fenced[0]


def explained(conn: sa.Connection, statement: str, parameters: object) -> dict:
    """PostgreSQL's ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` of ``statement``: its
    top plan node, each node as PostgreSQL gives it."""
    plan = conn.exec_driver_sql(
        f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}",
        parameters,  # type: ignore[arg-type]
    ).scalar_one()
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return plan[0]["Plan"]  # type: ignore[no-any-return]


def plan_nodes(node: dict) -> Iterator[dict]:
    """``node`` and every node under it."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


SUBSET_TABLES = ("failed_messages", "failed_message_groups")


def fenced_sorts(top: dict) -> list[dict]:
    """The ``Sort`` nodes of PostgreSQL's plan ``top`` of a fenced page that sort the
    members: a scan of a subset's table under them (``fenced`` plans the members on their
    own, a plain subquery scan elided), or the materialized CTE's scan, and no other sort
    (the page's rows, joined to the ids, are sorted again above)."""
    return [
        node
        for node in plan_nodes(top)
        if node["Node Type"] == "Sort"
        and not any(under["Node Type"] == "Sort" for under in list(plan_nodes(node))[1:])
        and any(
            under.get("Relation Name") in SUBSET_TABLES or under.get("CTE Name") == "members"
            for under in plan_nodes(node)
        )
    ]


def fenced_reads(engine: sa.Engine, where: FailedMessageFilter, order: Ordering) -> list[dict]:
    """The scans of ``failed_messages`` and ``failed_message_groups`` under the fence
    (the members sorted, or a materialized CTE's plan) of the first page of ``where`` in
    ``order``, from PostgreSQL's ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` of the
    statement the list runs: each plan node as PostgreSQL gives it."""
    with engine.connect() as conn:
        top = explained(conn, *fenced_statement(conn, where, order))
    fences = fenced_sorts(top) + [
        node for node in plan_nodes(top) if node.get("Subplan Name") == "CTE members"
    ]
    return [
        node
        for fence in fences
        for node in plan_nodes(fence)
        if node.get("Relation Name") in SUBSET_TABLES
    ]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_subsets_fenced_sort_reads_its_keys_from_the_index_alone_once_vacuumed(
    quiet_store: sa.Engine,
) -> None:
    """A subset's sort no index walks (the console's modified, an endpoint's or queue
    address's message type, status, id) reads the subset fenced and sorts it
    (docs/decisions.md "A subset is read from its own rows"): once ``VACUUM`` has marked
    the pages all-visible, as autovacuum does, the subset's sort keys come from the index
    the subset is read by (its ``INCLUDE`` columns, migration 0031), no page of the table:
    an index-only scan, no heap fetch. Rows outside the subset come first, as in
    production."""
    busy = [message(n, "Busy", BUSY) for n in range(SUBSET, SUBSET + OUTSIDE)]
    write(quiet_store, busy, clock_seconds=SUBSET + OUTSIDE)
    analyze(quiet_store, vacuum=True)
    heap_reads = {}
    for name, keys in FENCED_SORTS.items():
        for order in ORDERS:
            if order.key not in keys:
                continue
            scans = fenced_reads(quiet_store, SUBSETS[name], order)
            assert scans, (name, order)
            read = [
                (scan["Node Type"], scan.get("Index Name"), scan.get("Heap Fetches"))
                for scan in scans
                if scan["Node Type"] != "Index Only Scan" or scan.get("Heap Fetches") != 0
            ]
            if read:
                heap_reads[f"{name} by {order.key} {'desc' if order.descending else 'asc'}"] = read
    assert not heap_reads, f"fenced sorts reading the table: {heap_reads}"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_subsets_fenced_sort_reads_its_keys_from_an_index_alone_on_sqlite(
    quiet_store: sa.Engine,
) -> None:
    """As above on SQLite, which has no ``INCLUDE``: the fenced sorts' keys are the last
    columns of the index the subset is read by (migration 0033), whose plan says it
    reads that index alone (``USING COVERING INDEX``), never the table's rows."""
    busy = [message(n, "Busy", BUSY) for n in range(SUBSET, SUBSET + OUTSIDE)]
    write(quiet_store, busy, clock_seconds=SUBSET + OUTSIDE)
    uncovered = {}
    with quiet_store.connect() as conn:
        for name, keys in FENCED_SORTS.items():
            for order in ORDERS:
                if order.key not in keys:
                    continue
                statement, parameters = fenced_statement(conn, SUBSETS[name], order)
                plan = [
                    row[3]
                    for row in conn.exec_driver_sql(
                        f"EXPLAIN QUERY PLAN {statement}",
                        parameters,  # type: ignore[arg-type]
                    )
                ]
                members = [line for line in plan if line.startswith(("SEARCH", "SCAN"))]
                if not any("COVERING INDEX" in line for line in members[:1]):
                    direction = "desc" if order.descending else "asc"
                    uncovered[f"{name} by {order.key} {direction}"] = plan
    some = dict(list(uncovered.items())[:2])
    assert not uncovered, f"{len(uncovered)} fenced sorts reading the table, such as: {some}"


FENCE_OFFSETS = (0, 200)
"""The first page and a deep one (the subsets hold 150-300 messages)."""


def test_a_subsets_fenced_sort_streams_the_subset_into_a_bounded_sort(
    quiet_store: sa.Engine,
) -> None:
    """A subset's sort no index walks reads the subset fenced (docs/decisions.md "A subset
    is read from its own rows") and streams its rows into a sort that keeps the page's
    end alone: the subset is never held whole in a table of its own (a materialized CTE's
    tuplestore, which spills out of ``work_mem`` at 72,000 rows; SQLite's
    ``MATERIALIZE``), at the first page or a deep one. PostgreSQL: no ``CTE Scan`` or
    ``Materialize`` in the plan, the subset's scan under the ``Sort``, a top-N heapsort
    where the subset passes twice the page's end, no temp block written. SQLite: the
    fence a co-routine (``CO-ROUTINE members``), not ``MATERIALIZE``, read by the ``ORDER
    BY``'s sorter. Rows outside the subset come first, as in production."""
    busy = [message(n, "Busy", BUSY) for n in range(SUBSET, SUBSET + OUTSIDE)]
    write(quiet_store, busy, clock_seconds=SUBSET + OUTSIDE)
    analyze(quiet_store, vacuum=True)
    held = {}
    with quiet_store.connect() as conn:
        for name, keys in FENCED_SORTS.items():
            for order in ORDERS:
                if order.key not in keys:
                    continue
                for offset in FENCE_OFFSETS:
                    statement, parameters = fenced_statement(conn, SUBSETS[name], order, offset)
                    if conn.dialect.name == "postgresql":
                        found = held_in_postgresql(explained(conn, statement, parameters), offset)
                    else:
                        found = held_in_sqlite(conn, statement, parameters)
                    if found:
                        direction = "desc" if order.descending else "asc"
                        held[f"{name} by {order.key} {direction} from {offset}"] = found
    some = dict(list(held.items())[:3])
    assert not held, f"{len(held)} fenced sorts holding the subset, such as: {some}"


def held_in_postgresql(top: dict, offset: int) -> list[str]:
    """What in PostgreSQL's plan ``top`` of a fenced page (``limit`` 50 from ``offset``)
    holds the subset whole or writes it out, or does not sort it as it streams."""
    nodes = list(plan_nodes(top))
    found = [
        f"{node['Node Type']} {node.get('Alias', '')}".strip()
        for node in nodes
        if node["Node Type"] in ("CTE Scan", "Materialize")
    ]
    if top.get("Temp Written Blocks"):
        found.append(f"{top['Temp Written Blocks']} temp blocks written")
    sorts = fenced_sorts(top)
    if not sorts:
        found.append("no sort of the members: " + ", ".join(n["Node Type"] for n in nodes))
    for sort in sorts:
        rows = sort["Plans"][0]["Actual Rows"]
        if rows > 2 * (offset + 50) and sort.get("Sort Method") != "top-N heapsort":
            found.append(f"Sort Method {sort.get('Sort Method')} of {rows} rows")
    return found


def held_in_sqlite(conn: sa.Connection, statement: str, parameters: object) -> list[str]:
    """What in SQLite's ``EXPLAIN QUERY PLAN`` of a fenced page holds the subset in a
    table of its own (``MATERIALIZE``), or the plan's lines when the fence is not a
    co-routine sorted by the ``ORDER BY``'s sorter."""
    plan = [
        row[3]
        for row in conn.exec_driver_sql(
            f"EXPLAIN QUERY PLAN {statement}",
            parameters,  # type: ignore[arg-type]
        )
    ]
    if "MATERIALIZE members" in plan:
        return plan
    if "CO-ROUTINE members" not in plan or "USE TEMP B-TREE FOR ORDER BY" not in plan:
        return plan
    return []
