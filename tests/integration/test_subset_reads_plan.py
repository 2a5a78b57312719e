"""A subset's first page reads the rows of that subset, never rows outside it.

docs/design.md "Reads at scale": a group or an endpoint that stopped failing is opened
after new failures elsewhere; its first page, in every sort key and direction, must cost
what it cost before they arrived. Checked on the work the store reports, never on a time:
PostgreSQL's tuples read in this transaction by scans of tables and indexes
(``pg_stat_get_xact_tuples_returned``), SQLite's virtual-machine steps (a progress
handler). The page sizes are
shrunk (``WALK_SORT_INDEX_PAST``) so a subset of a few hundred takes the path of a subset
of hundreds of thousands.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa

from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt, FailureGroup
from controlroom.errors.read import lists
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
}
ORDERS = [Ordering(key, descending) for key in SORT_KEYS for descending in (True, False)]
GROWTH = 1.5  # work after the outside rows / work before, at most


def message(n: int, endpoint: str, group: FailureGroup) -> FailedAttempt:
    """Message ``n`` of ``endpoint`` in ``group``, sent and failed at second ``n``."""
    sent = at(n)
    return dataclasses.replace(
        attempt(n, sent + timedelta(seconds=1), endpoint=endpoint, groups=(group,)),
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


def first_page_work(engine: sa.Engine, where: FailedMessageFilter, order: Ordering) -> int:
    """The work of reading the first page of ``where`` in ``order`` (and its total)."""
    with engine.connect() as conn:
        counter = work_counter(conn)
        before = counter()
        page = lists.list_failed_messages(conn, offset=0, limit=50, where=where, order=order)
        work = counter() - before
    assert page.items, (where, order)
    return work


def analyze(engine: sa.Engine) -> None:
    """PostgreSQL's statistics refreshed, as its autovacuum would; SQLite keeps none in
    production (nothing runs its ``ANALYZE``), so none here."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")


@pytest.fixture
def quiet_store(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[sa.Engine]:
    """``SUBSET`` messages of endpoint Quiet in group QUIET, sent and failed before any
    other; every tenth archived. Lists of more than 100 matches take their large path."""
    monkeypatch.setattr(lists, "WALK_SORT_INDEX_PAST", 100)
    write(engine, [message(n, "Quiet", QUIET) for n in range(SUBSET)], clock_seconds=SUBSET)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE failed_messages SET status = :archived WHERE message_id LIKE '%0'"),
            {"archived": int(FailedMessageStatus.ARCHIVED)},
        )
    analyze(engine)
    yield engine


def test_a_subsets_first_page_reads_no_rows_outside_it(quiet_store: sa.Engine) -> None:
    before = {
        (name, order): first_page_work(quiet_store, where, order)
        for name, where in SUBSETS.items()
        for order in ORDERS
    }
    busy = [message(n, "Busy", BUSY) for n in range(SUBSET, SUBSET + OUTSIDE)]
    write(quiet_store, busy, clock_seconds=SUBSET + OUTSIDE)
    analyze(quiet_store)
    grown = {}
    for name, where in SUBSETS.items():
        for order in ORDERS:
            after = first_page_work(quiet_store, where, order)
            if after > GROWTH * before[name, order] + 50:
                grown[f"{name} by {order.key} {'desc' if order.descending else 'asc'}"] = (
                    before[name, order],
                    after,
                )
    assert not grown, f"work before -> after {OUTSIDE} rows outside the subset: {grown}"
