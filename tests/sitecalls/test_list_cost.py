"""The site-call lists' first page costs a page, however many rows the table holds, now
that they order by the whole stamp to 100 ns (docs/design.md "Reads at scale"): each
order's instant leads an index of migration 0005, and the ticks and ids below it are
sorted within one instant only (SQLite sorts the right part of the order, PostgreSQL
sorts incrementally). Checked on the work the store reports, never on a time
(``test_subset_reads_plan.work_counter``), per provider."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
import sqlalchemy as sa

from controlroom.sitecalls import queries
from controlroom.sitecalls.writer import SiteCallWriter
from tests.integration.test_subset_reads_plan import analyze, work_counter
from tests.sitecalls.packets import T0, packet, write

PAGE = 10
CHUNK = 200

LISTS: dict[str, Callable[[sa.Connection, str | None], queries.Page]] = {
    "site calls": lambda conn, after: queries.list_site_calls(
        conn, queries.SiteCallFilter(), limit=PAGE, after=after
    ),
    "site calls of a site": lambda conn, after: queries.list_site_calls(
        conn, queries.SiteCallFilter(site="site-a"), limit=PAGE, after=after
    ),
    "site calls of a status": lambda conn, after: queries.list_site_calls(
        conn, queries.SiteCallFilter(status="Submitted"), limit=PAGE, after=after
    ),
    "audit log": lambda conn, after: queries.list_audit_events(
        conn, queries.AuditFilter(), limit=PAGE, after=after
    ),
    "audit log of an actor": lambda conn, after: queries.list_audit_events(
        conn, queries.AuditFilter(actor="site-a/node-1"), limit=PAGE, after=after
    ),
}


def add_calls(engine: sa.Engine, first: int, count: int) -> None:
    """``count`` calls (and an audit event each), the n-th created n seconds after T0."""
    writer = SiteCallWriter(engine)
    for start in range(first, first + count, CHUNK):
        packets = []
        for n in range(start, min(start + CHUNK, first + count)):
            at = T0 + timedelta(seconds=n)
            packets.append(
                packet(
                    "Submitted",
                    op_id=str(uuid.uuid4()),
                    at=at,
                    event_id=str(uuid.uuid4()),
                    created_at_utc=at.isoformat(),
                )
            )
        write(writer, *packets)


def second_page_work(engine: sa.Engine, name: str) -> int:
    """The work of the page after the first (the cursor's bound in play too)."""
    with engine.connect() as conn:
        first = LISTS[name](conn, None)
        assert len(first.rows) == PAGE and first.next_cursor is not None
    with engine.connect() as conn, conn.begin():
        work = work_counter(conn)
        before = work()
        second = LISTS[name](conn, first.next_cursor)
        spent = work() - before
    assert len(second.rows) == PAGE
    return spent


@pytest.mark.parametrize("name", sorted(LISTS))
def test_a_site_call_lists_page_costs_a_page_not_the_table(engine: sa.Engine, name: str) -> None:
    add_calls(engine, 0, 100)
    analyze(engine)
    small = second_page_work(engine, name)
    add_calls(engine, 100, 2_000)
    analyze(engine)
    large = second_page_work(engine, name)

    assert large <= small * 2 + 5, (name, small, large)
