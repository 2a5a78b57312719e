"""The site-call KPIs read counts the database keeps, and cost the same whatever the backlog.

docs/decisions.md "The database keeps the counts": the non-terminal site calls are counted
per (source_site, source_node, status) in ``site_call_counts`` by the database's triggers,
in the transaction that changes a call, whatever code changes it. Properties:

- after any sequence of upserts (new calls, later states, epochs, foreign packets), rows
  pulled by reconciliation, purges and folds (an operator's Retry/Discard is relayed to
  the site and changes no row here: its effect arrives as telemetry), the counts equal
  the query-time aggregate of ``site_calls`` and the KPIs equal those the aggregate gives
  (the query ``measure_kpis`` ran before the counts);
- on PostgreSQL two writers of calls of one key, each in an open transaction, never wait
  for each other (nor for a fold);
- the global KPIs' work (tuples read on PostgreSQL, virtual-machine steps on SQLite, as
  ``tests/integration/test_subset_reads_plan.py`` counts them) does not grow with the
  number of buffered calls.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlroom.config import ConfiguredSite
from controlroom.db.counts import fold_counts
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.providers import provider_for
from controlroom.db.tables import site_call_counts, site_calls
from controlroom.db.transactions import begin_write
from controlroom.sitecalls import kpis as kpis_module
from controlroom.sitecalls import writer as writer_module
from controlroom.sitecalls.kpis import PENDING_PREDICATE, measure_kpis
from controlroom.sitecalls.reconciliation import receive_row
from controlroom.sitecalls.retention import purge_site_call_history
from controlroom.sitecalls.upsert import upsert_site_calls
from controlroom.sitecalls.writer import SiteCallWriter, site_call_row
from controlroom.telemetry.ordering import BUFFERED, SiteCallStatus
from tests.integration.test_subset_reads_plan import work_counter
from tests.sitecalls.packets import packet, received, write

sc = site_calls.c
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
TEN_MINUTES = timedelta(minutes=10)
IDS = [str(uuid.UUID(int=n + 1)) for n in range(6)]
STATUSES = [s.value for s in SiteCallStatus]
_BUFFERED = {s.value for s in BUFFERED}


def counted(conn: sa.Connection) -> dict[tuple[Any, ...], int]:
    """The counts the database keeps, summed per key, keys of 0 left out."""
    c = site_call_counts.c
    rows = conn.execute(
        sa.select(c.source_site, c.source_node, c.status, sa.func.sum(c.n)).group_by(
            c.source_site, c.source_node, c.status
        )
    )
    return {(r[0], r[1], r[2]): int(r[3]) for r in rows if int(r[3]) != 0}


def aggregate(conn: sa.Connection) -> dict[tuple[Any, ...], int]:
    rows = conn.execute(
        sa.select(sc.source_site, sc.source_node, sc.status, sa.func.count())
        .where(PENDING_PREDICATE)
        .group_by(sc.source_site, sc.source_node, sc.status)
    )
    return {(r[0], r[1], r[2]): int(r[3]) for r in rows}


def aggregate_kpis(conn: sa.Connection, now: datetime) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The buffered KPIs per node as the query-time aggregate over every pending row."""
    figures: dict[tuple[Any, ...], dict[str, Any]] = {}
    stuck_before = now - TEN_MINUTES
    for row in conn.execute(sa.select(site_calls).where(PENDING_PREDICATE)):
        node = figures.setdefault(
            (row.source_site, row.source_node),
            {"buffered": 0, "parked": 0, "stuck": 0, "oldest": None},
        )
        if row.status == "Parked":
            node["parked"] += 1
            continue
        node["buffered"] += 1
        node["stuck"] += row.created_at_utc < stuck_before
        if node["oldest"] is None or row.created_at_utc < node["oldest"]:
            node["oldest"] = row.created_at_utc
    return figures


def measured_kpis(conn: sa.Connection, now: datetime) -> dict[tuple[Any, ...], dict[str, Any]]:
    report = measure_kpis(conn, now=now, interval=HOUR, stuck_threshold=TEN_MINUTES)
    return {
        key: {
            "buffered": f.buffered,
            "parked": f.parked,
            "stuck": f.stuck,
            "oldest": f.oldest_pending_created,
        }
        for key, f in report.by_node.items()
        if f.buffered or f.parked
    }


def assert_counts_equal_aggregate(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        assert counted(conn) == aggregate(conn)
        for now in (NOW, NOW + HOUR):
            assert measured_kpis(conn, now) == aggregate_kpis(conn, now)


def clear(engine: sa.Engine) -> None:
    with begin_write(engine) as conn:
        conn.execute(sa.delete(site_calls))
        conn.execute(sa.text("DELETE FROM site_call_tombstones"))


# --- the operations -----------------------------------------------------------------------
def upsert(
    engine: sa.Engine,
    n: int,
    status: str,
    minute: int,
    epoch: int,
    where: int,
    writer: SiteCallWriter | None = None,
) -> None:
    """A packet of call ``n``: one of three sites and nodes (one of them none), created
    ``minute`` minutes before ``NOW`` (a later packet of the same call may move it)."""
    site, node = [("site-a", "node-1"), ("site-a", None), ("site-b", "node-1")][where]
    at = NOW - timedelta(minutes=minute)
    data = packet(
        status, op_id=IDS[n], at=at, epoch=epoch, source_site=site, source_node=node, retry_count=0
    )
    data["created_at_utc"] = (at - timedelta(minutes=1)).isoformat()
    write(writer or SiteCallWriter(engine, clock=lambda: NOW), data)


def upsert_many(engine: sa.Engine, first: int, status: str, minute: int) -> None:
    """Three calls at once (one statement of the writer), from ``first`` on."""
    writer = SiteCallWriter(engine, clock=lambda: NOW)
    packets = []
    for n in range(first, first + 3):
        at = NOW - timedelta(minutes=minute + n)
        data = packet(status, op_id=IDS[n % len(IDS)], at=at, source_node=f"node-{n % 2}")
        data["created_at_utc"] = (at - timedelta(minutes=1)).isoformat()
        packets.append(data)
    write(writer, *packets)


def reconcile(engine: sa.Engine, n: int, status: str, minute: int, where: int) -> None:
    """Call ``n``'s row as site-a's agent answers a pull, written as reconciliation writes
    it (a row naming another site is refused)."""
    site, node = [("site-a", "node-1"), ("site-a", None), ("site-b", "node-1")][where]
    at = NOW - timedelta(minutes=minute)
    data = packet(status, op_id=IDS[n], at=at, source_site=site, source_node=node)
    data["created_at_utc"] = (at - timedelta(minutes=2)).isoformat()
    pulled_from = ConfiguredSite(id="site-a", base_url="http://site-a.example")
    SiteCallWriter(engine, clock=lambda: NOW).write([receive_row(data, pulled_from)])


def purge(engine: sa.Engine) -> None:
    purge_site_call_history(
        engine,
        now=NOW + timedelta(days=2),
        site_call_days=1,
        audit_days=3650,
        tombstone_days=0,
    )
    clear_tombstones = sa.text("DELETE FROM site_call_tombstones")
    with begin_write(engine) as conn:  # a purged id may come back in a later step
        conn.execute(clear_tombstones)


step = st.one_of(
    st.tuples(
        st.just("upsert"),
        st.integers(0, len(IDS) - 1),
        st.sampled_from(STATUSES),
        st.integers(0, 40),
        st.integers(0, 1),
        st.integers(0, 2),
    ),
    st.tuples(
        st.just("upsert_many"),
        st.integers(0, len(IDS) - 1),
        st.sampled_from(STATUSES),
        st.integers(0, 40),
    ),
    st.tuples(
        st.just("reconcile"),
        st.integers(0, len(IDS) - 1),
        st.sampled_from(STATUSES),
        st.integers(0, 40),
        st.integers(0, 2),
    ),
    st.tuples(st.just("purge")),
    st.tuples(st.just("fold")),
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(step, min_size=1, max_size=20))
def test_counts_and_kpis_equal_the_aggregate_after_any_operations(
    engine: sa.Engine, steps: list[tuple[Any, ...]]
) -> None:
    clear(engine)
    for name, *arguments in steps:
        if name == "upsert":
            upsert(engine, *arguments)
        elif name == "upsert_many":
            upsert_many(engine, *arguments)
        elif name == "reconcile":
            reconcile(engine, *arguments)
        elif name == "purge":
            purge(engine)
        else:
            fold_counts(engine, site_call_counts)
        assert_counts_equal_aggregate(engine)


def test_existing_calls_are_counted_by_the_migration(engine: sa.Engine) -> None:
    """The migration fills the counts of the rows stored before it (downgrade, write,
    upgrade again)."""
    upsert(engine, 0, "Submitted", 5, 0, 0)
    upsert(engine, 1, "Parked", 5, 0, 1)
    upsert(engine, 2, "Delivered", 5, 0, 2)
    command.downgrade(alembic_config(engine), "-1")
    with begin_write(engine) as conn:
        conn.execute(sa.delete(site_calls).where(sc.tracked_operation_id == IDS[0]))
    upsert(engine, 3, "Attempted", 5, 0, 0)
    upgrade_database(engine)
    assert_counts_equal_aggregate(engine)
    with engine.connect() as conn:
        assert sum(counted(conn).values()) == 2


def _row(n: int, status: str) -> dict[str, Any]:
    data = packet(status, op_id=str(uuid.UUID(int=1000 + n)), at=NOW)
    item = received(data)
    assert item.packet is not None
    return site_call_row(item.packet, NOW)


def test_two_writers_of_one_key_never_wait_for_each_other(postgresql_url: str) -> None:
    """Each writer's transaction stays open while the other writes calls of the same key,
    then the fold runs with both open: none of them waits (``lock_timeout``: a wait is an
    error here, not a slow test)."""
    engine = create_store_engine(postgresql_url)
    upgrade_database(engine)
    provider = provider_for(engine)
    try:
        wait = "SET LOCAL lock_timeout = '3s'"
        with (
            engine.connect() as first,
            engine.connect() as second,
            engine.connect() as folder,
            first.begin(),
        ):
            first.exec_driver_sql(wait)
            upsert_site_calls(first, provider, [_row(1, "Submitted")])
            with second.begin():
                second.exec_driver_sql(wait)
                upsert_site_calls(second, provider, [_row(2, "Submitted")])
                upsert_site_calls(second, provider, [_row(1000, "Attempted")])
                upsert_site_calls(first, provider, [_row(3, "Submitted")])
                with folder.begin():
                    folder.exec_driver_sql(wait)
                    provider.compact_counts(folder, site_call_counts)
        fold_counts(engine, site_call_counts)
        assert_counts_equal_aggregate(engine)
        with engine.connect() as conn:
            assert counted(conn)[("site-a", "node-1", "Submitted")] == 3
    finally:
        engine.dispose()


# --- the work of the global KPIs ----------------------------------------------------------
def write_backlog(engine: sa.Engine, calls: int, first: int) -> None:
    """``calls`` buffered calls over two sites and two nodes, created two days ago
    (stuck), in the writer's chunks."""
    writer = SiteCallWriter(engine, clock=lambda: NOW)
    statuses = ["Submitted", "Forwarded", "Attempted", "Skipped", "Parked"]
    for start in range(first, first + calls, 500):
        packets = []
        for n in range(start, min(start + 500, first + calls)):
            at = NOW - timedelta(days=2, seconds=n)
            data = packet(
                statuses[n % 5],
                op_id=str(uuid.UUID(int=n + 1)),
                at=at,
                source_site=f"site-{n % 2}",
                source_node=f"node-{n % 3 % 2}",
            )
            data["created_at_utc"] = (at - timedelta(seconds=1)).isoformat()
            packets.append(data)
        write(writer, *packets)


def kpi_work(engine: sa.Engine) -> int:
    fold_counts(engine, site_call_counts)
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE site_calls, site_call_counts")
    with engine.connect() as conn, conn.begin():
        work = work_counter(conn)
        before = work()
        report = measure_kpis(conn, now=NOW, interval=HOUR, stuck_threshold=TEN_MINUTES)
        spent = work() - before
        assert report.total().buffered > 0
    return spent


def test_the_global_kpis_work_does_not_grow_with_the_backlog(engine: sa.Engine) -> None:
    write_backlog(engine, 300, 0)
    small = kpi_work(engine)
    write_backlog(engine, 3_000, 300)
    large = kpi_work(engine)
    # Ten times the backlog; the same keys. Today's scan of every pending row reads ten
    # times as much; counts and index probes read what they read before.
    assert large <= small * 1.5 + 20, (small, large)


def count_rows(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(site_call_counts)).scalar_one()


def test_the_writer_and_a_reading_fold_the_counts(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL appends a count row per statement and key; the writer folds them after
    ``FOLD_AFTER_CALLS`` packets, a reading after it finds more than ``FOLD_AFTER_ROWS``
    (SQLite keeps one row per key throughout). No count changes."""
    monkeypatch.setattr(writer_module, "FOLD_AFTER_CALLS", 10**9)
    for n in range(6):
        upsert(engine, n, "Submitted", 5, 0, 0)
    keys = 1
    appended = count_rows(engine)
    assert appended == (6 if provider_for(engine).keeps_tally_deltas else keys)
    monkeypatch.setattr(kpis_module, "FOLD_AFTER_ROWS", 3)
    assert_counts_equal_aggregate(engine)  # the reading folds after it
    assert count_rows(engine) == keys
    monkeypatch.setattr(writer_module, "FOLD_AFTER_CALLS", 4)
    writer = SiteCallWriter(engine, clock=lambda: NOW)
    for n in range(4):
        upsert(engine, n, "Forwarded", 4, 0, 0, writer)
    assert count_rows(engine) == 2  # Submitted and Forwarded: the fourth write folded them
    assert_counts_equal_aggregate(engine)
