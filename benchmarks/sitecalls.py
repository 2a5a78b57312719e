"""Site-call benchmark on PostgreSQL: telemetry packets per second through the write path
beside a naive baseline in the same run, and the KPI queries' latency at 1,000,000 rows.

What it does (``benchmarks/README.md`` has the figures and how to read them):

1. Generates ``--packets`` (default 100,000) telemetry packets over ``--ids`` (default
   20,000) tracked operations, each packet with its own audit event: every call a real
   lifecycle (Submitted, Forwarded, 1-3 Attempted/Skipped, then Delivered, Failed or
   Parked), all calls interleaved in time order, then ``--out-of-order`` (10%) of the
   packets moved a few places later and ``--duplicates`` (10%) sent twice (same event).
2. Validates them with the telemetry contract (timed on its own: CPU only).
3. In a scratch database with the migrations applied, on an emptied schema each time:

   * **write path**: ``SiteCallWriter.write`` over batches of the production batch size
     (``IngestionSettings().batch_size``), one batch at a time, then two at once from two
     threads, as ``serve`` does (``concurrent_batches``);
   * **naive baseline**: per packet, one transaction: read the row, decide in Python with
     ``ordering.supersedes``, INSERT or UPDATE, read the audit event's id, INSERT it if
     absent, commit — over the first ``--naive-packets`` (default 10,000) packets: its
     rate is per packet and flat.

   Both end states are checked: every id's row equals the in-order fold of its packets.
4. ``--trigger-rounds`` (default 0): the write path one batch at a time with the
   site-call counts' triggers (migration 0028) and without them (disabled for the run),
   alternately, the order swapped every round: packets/s and client CPU per packet per
   run, the ratio with / without per round and its median.
5. For each share of ``--in-flight`` (percent of the rows, default ``3``; ``3,30`` gives
   30,000 and 300,000 calls in flight at a million rows): loads ``--kpi-rows`` (default
   1,000,000) ``site_calls`` rows with one ``INSERT ... SELECT generate_series`` (30 sites
   x 2 nodes; the in-flight share one part Parked, the rest buffered, created over the
   last ``2 h x share / 3 %`` so that as many are created per minute whatever the share;
   the rest terminal over a year), ``VACUUM ANALYZE``, then times ``measure_kpis`` (the
   counts the database keeps) and the query it ran before them (``kpis_by_scan``: every
   non-terminal row grouped), call by call alternately, globally, for one site and for
   one node (``--kpi-runs`` each, default 200): p50 and p95; both must give the same
   figures.

Run: ``.venv/bin/python benchmarks/sitecalls.py``. Server: ``CONTROLROOM_BENCH_POSTGRESQL_URL``
(an admin URL; the scratch database is created next to it).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from ingest import environment, scratch_database
from rich.console import Console
from rich.table import Table

from controlroom.config import IngestionSettings
from controlroom.db.engine import create_store_engine
from controlroom.db.kpi_history import KpiFigures
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import audit_log, site_calls
from controlroom.sitecalls.kpis import PENDING_PREDICATE, KpiReport, measure_kpis
from controlroom.sitecalls.writer import ReceivedPacket, SiteCallWriter, audit_row, site_call_row
from controlroom.telemetry.contract import TelemetryPacket, validate_packet
from controlroom.telemetry.ordering import BUFFERED, fold_states, supersedes
from controlroom.telemetry.stamps import stamp_of

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
ADMIN_URL_ENV = "CONTROLROOM_BENCH_POSTGRESQL_URL"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SITES = [f"site-{n:02d}" for n in range(30)]
console = Console(width=130)


# --- packets ------------------------------------------------------------------------------
def lifecycle(rng: random.Random, op_id: str, start: datetime) -> list[dict[str, Any]]:
    site = rng.choice(SITES)
    node = f"{site}-gw-{rng.randint(1, 2)}"
    target = rng.choice(
        ["https://erp.example.com/api/orders", "https://billing.example.com/v2/invoices"]
    )
    steps = ["Submitted", "Forwarded"]
    # 0-3 attempts: 4.5 packets per call on average, so 20,000 calls make ~90,000 packets
    steps += [rng.choice(["Attempted", "Attempted", "Skipped"]) for _ in range(rng.randint(0, 3))]
    steps.append(rng.choices(["Delivered", "Failed", "Parked"], weights=[85, 5, 10])[0])
    packets, at = [], start
    for retry, status in enumerate(steps):
        at += timedelta(seconds=rng.randint(1, 120))
        terminal = status in ("Delivered", "Failed")
        packets.append(
            {
                "tracked_operation_id": op_id,
                "channel": "ApiOutbound",
                "target": target,
                "source_site": site,
                "source_node": node,
                "status": status,
                "retry_count": retry,
                "last_error": None if status in ("Submitted", "Delivered") else "HTTP 503",
                "http_status": 200 if status == "Delivered" else 503,
                "created_at_utc": start.isoformat(),
                "updated_at_utc": at.isoformat(),
                "terminal_at_utc": at.isoformat() if terminal else None,
                "epoch": 0,
                "audit_event": {
                    "event_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                    "occurred_at_utc": at.isoformat(),
                    "actor": f"{site}/{node}",
                    "action": f"Call{status}",
                    "outcome": "Failure" if status == "Failed" else "Success",
                    "category": "CachedCall",
                    "target": target,
                    "correlation_id": op_id,
                },
            }
        )
    return packets


def generate(
    packets: int, ids: int, out_of_order: float, duplicates: float, seed: int
) -> list[dict[str, Any]]:
    """``packets`` packets over ``ids`` calls in arrival order (see the module doc)."""
    rng = random.Random(seed)
    unique_target = round(packets * (1 - duplicates))
    calls = [
        lifecycle(
            rng,
            str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            NOW - timedelta(seconds=rng.randint(0, 86_400)),
        )
        for _ in range(ids)
    ]
    # In time order; the latest packets beyond the target are calls still in flight.
    arrival = sorted((p for call in calls for p in call), key=lambda p: p["updated_at_utc"])
    arrival = arrival[:unique_target]
    for index in rng.sample(range(len(arrival)), round(len(arrival) * out_of_order)):
        later = min(len(arrival) - 1, index + rng.randint(1, 50))
        arrival.insert(later, arrival.pop(index))
    while len(arrival) < packets:
        copy = arrival[rng.randrange(len(arrival))]
        arrival.insert(rng.randrange(len(arrival) + 1), copy)
    return arrival


# --- methods ------------------------------------------------------------------------------
def reset(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE audit_log DISABLE TRIGGER audit_log_no_truncate")
        conn.exec_driver_sql("TRUNCATE site_calls, audit_log, audit_event_ids, rejected_telemetry")
        conn.exec_driver_sql("ALTER TABLE audit_log ENABLE TRIGGER audit_log_no_truncate")


def write_path(engine: sa.Engine, items: list[ReceivedPacket], threads: int) -> float:
    writer = SiteCallWriter(engine)
    size = IngestionSettings().batch_size
    batches = [items[i : i + size] for i in range(0, len(items), size)]
    started = time.perf_counter()
    if threads == 1:
        for batch in batches:
            writer.write(batch)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(writer.write, batches))
    return time.perf_counter() - started


def naive(engine: sa.Engine, packets: Sequence[TelemetryPacket]) -> float:
    """Read, decide in Python, write, commit — per packet."""
    sc, al = site_calls.c, audit_log.c
    started = time.perf_counter()
    with engine.connect() as conn:
        for packet in packets:
            with conn.begin():
                now = datetime.now(UTC)
                row = site_call_row(packet, now)
                current = conn.execute(
                    sa.select(site_calls).where(
                        sc.tracked_operation_id == row["tracked_operation_id"]
                    )
                ).one_or_none()
                if current is None:
                    conn.execute(sa.insert(site_calls).values(row))
                elif supersedes(packet, stored_state(current)):
                    conn.execute(
                        sa.update(site_calls)
                        .where(sc.tracked_operation_id == row["tracked_operation_id"])
                        .values(row)
                    )
                event = audit_row(packet, now)
                if (
                    event is not None
                    and conn.execute(
                        sa.select(al.event_id).where(al.event_id == event["event_id"])
                    ).first()
                    is None
                ):
                    conn.execute(sa.insert(audit_log).values(event))
    return time.perf_counter() - started


def stored_state(row: Any) -> SimpleNamespace:
    """A stored row as ``ordering.supersedes`` reads a state: its update as a ``Stamp``
    (the instant and its 100 ns, migration 0017)."""
    return SimpleNamespace(
        epoch=row.epoch, status=row.status, updated_at_utc=stamp_of(row, "updated_at")
    )


def check_end_state(engine: sa.Engine, packets: Sequence[TelemetryPacket]) -> int:
    """Rows that differ from the in-order fold of their packets (should be 0)."""
    by_id: dict[str, list[TelemetryPacket]] = {}
    for packet in sorted(packets, key=lambda p: (p.updated_at_utc, p.epoch)):
        by_id.setdefault(packet.tracked_operation_id, []).append(packet)
    with engine.connect() as conn:
        rows = {r.tracked_operation_id: r for r in conn.execute(sa.select(site_calls))}
    wrong = 0
    for op_id, states in by_id.items():
        survivor, row = fold_states(states), rows.get(op_id)
        if row is None or (row.status, stamp_of(row, "updated_at")) != (
            survivor.status.value,
            survivor.updated_at_utc,
        ):
            wrong += 1
    return wrong


# --- KPIs at a million rows -----------------------------------------------------------------
LOAD_SQL = """
INSERT INTO site_calls (tracked_operation_id, channel, target, source_site, source_node,
    status, retry_count, last_error, http_status, created_at_utc, updated_at_utc,
    terminal_at_utc, ingested_at_utc, epoch)
SELECT md5(n::text)::uuid::text, 'ApiOutbound', 'https://erp.example.com/api/orders',
    'site-' || lpad((n % 30)::text, 2, '0'),
    'site-' || lpad((n % 30)::text, 2, '0') || '-gw-' || (1 + (n / 30) % 2)::text,
    s.status, 1, NULL, 200, s.created, s.created + interval '30 seconds',
    CASE WHEN s.status IN ('Delivered', 'Failed', 'Discarded')
         THEN s.created + interval '30 seconds' END,
    s.created + interval '31 seconds', 0
FROM generate_series(1::bigint, :rows) AS n,
LATERAL (SELECT
    CASE WHEN (n / 60) % 100 < :inflight - 1
              THEN (ARRAY['Submitted', 'Forwarded', 'Attempted', 'Skipped'])[1 + (n / 7) % 4]
         WHEN (n / 60) % 100 = :inflight - 1 THEN 'Parked'
         WHEN (n / 60) % 100 < :inflight + 4 THEN 'Failed'
         WHEN (n / 60) % 100 = :inflight + 4 THEN 'Discarded'
         ELSE 'Delivered' END AS status,
    CASE WHEN (n / 60) % 100 < :inflight
              THEN :now - ((n * 7919) % (2400 * :inflight)) * interval '1 second'
         ELSE :now - ((n * 7919) % 31536000) * interval '1 second' END AS created
) AS s
"""


def load_kpi_rows(engine: sa.Engine, rows: int, in_flight: int) -> float:
    """``rows`` calls, ``in_flight`` percent of them non-terminal (see the module doc)."""
    reset(engine)
    started = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(
            sa.text(LOAD_SQL),
            {"rows": rows, "now": NOW.replace(tzinfo=None), "inflight": in_flight},
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE site_calls, site_call_counts")
    return time.perf_counter() - started


def kpis_by_scan(
    conn: sa.Connection,
    *,
    now: datetime,
    interval: timedelta,
    stuck_threshold: timedelta,
    site: str | None = None,
    node: str | None = None,
) -> KpiReport:
    """The non-terminal figures as ``measure_kpis`` counted them before the counts the
    database keeps (migration 0028): every pending row grouped, by an index-only scan of
    ``ix_site_calls_pending``; the terminal figures by the same statement as
    ``measure_kpis``."""
    sc = site_calls.c
    scope = [] if site is None else [sc.source_site == site]
    scope += [] if node is None else [sc.source_node == node]
    stuck_before = now - stuck_threshold
    pending = (
        sa.select(
            sc.source_site,
            sc.source_node,
            sc.status,
            sa.func.count().label("calls"),
            sa.func.min(sc.created_at_utc).label("oldest"),
            sa.func.count(sa.case((sc.created_at_utc < stuck_before, 1))).label("old"),
        )
        .where(PENDING_PREDICATE, *scope)
        .group_by(sc.source_site, sc.source_node, sc.status)
    )
    report = KpiReport(now=now)
    for row in conn.execute(pending):
        figures = report.node((row.source_site, row.source_node))
        if row.status == "Parked":
            figures.parked += row.calls
        elif row.status in {status.value for status in BUFFERED}:
            figures.buffered += row.calls
            figures.stuck += row.old
            figures.add(KpiFigures(oldest_pending_created=row.oldest))
    finished = (
        sa.select(sc.source_site, sc.source_node, sc.status, sa.func.count().label("calls"))
        .where(
            sc.terminal_at_utc > now - interval,
            sc.terminal_at_utc <= now,
            sc.status.in_(["Failed", "Delivered"]),
            *scope,
        )
        .group_by(sc.source_site, sc.source_node, sc.status)
    )
    for row in conn.execute(finished):
        figures = report.node((row.source_site, row.source_node))
        if row.status == "Failed":
            figures.failed_last_interval += row.calls
        else:
            figures.delivered_last_interval += row.calls
    return report


KPI_METHODS = {"counts (measure_kpis)": measure_kpis, "scan (before 0028)": kpis_by_scan}


def time_kpis(
    engine: sa.Engine, runs: int, **scope: str
) -> dict[str, tuple[float, float, dict[str, Any]]]:
    """Per method of ``KPI_METHODS``: p50 and p95 in ms over ``runs`` calls, the methods
    called alternately (the order swapped every call), and the figures. Raises
    ``AssertionError`` when the methods' figures differ."""
    timings: dict[str, list[float]] = {name: [] for name in KPI_METHODS}
    figures: dict[str, dict[str, Any]] = {}
    with engine.connect() as conn:
        for run in range(runs):
            names = list(KPI_METHODS) if run % 2 else list(reversed(KPI_METHODS))
            for name in names:
                started = time.perf_counter()
                report = KPI_METHODS[name](
                    conn,
                    now=NOW,
                    interval=timedelta(hours=1),
                    stuck_threshold=timedelta(minutes=10),
                    **scope,
                )
                figures[name] = report.total().as_dict(NOW)
                timings[name].append((time.perf_counter() - started) * 1000)
                conn.rollback()
    first, *others = figures.values()
    assert all(other == first for other in others), figures
    answer = {}
    for name, values in timings.items():
        values.sort()
        answer[name] = (statistics.median(values), values[int(len(values) * 0.95) - 1], first)
    return answer


COUNT_TRIGGERS = ("site_calls_count_insert", "site_calls_count_update", "site_calls_count_delete")
"""The triggers of the site-call counts (migration 0028); the TRUNCATE one stays on."""


def compare_triggers(
    engine: sa.Engine, items: list[ReceivedPacket], rounds: int
) -> list[tuple[int, bool, float, float, float, float]]:
    """``--trigger-rounds``: per run of the write path one batch at a time, (round, with
    triggers, packets/s, client CPU ms per packet, ms per packet the server spent in the
    counts' trigger functions, load average); with the counts' triggers and without them
    (disabled for the run, then the tables emptied, which empties the counts),
    alternately, the order swapped every round. Garbage collector on, as ``serve`` runs.
    The triggers' time is PostgreSQL's ``pg_stat_user_functions`` (``track_functions``),
    reset before each run."""
    runs = []
    for round_ in range(1, rounds + 1):
        for counted in (True, False) if round_ % 2 else (False, True):
            reset(engine)
            write_path(engine, items[:400], 1)  # warm up
            reset(engine)
            if not counted:
                with engine.begin() as conn:
                    for trigger in COUNT_TRIGGERS:
                        conn.exec_driver_sql(f"ALTER TABLE site_calls DISABLE TRIGGER {trigger}")
            gc.collect()
            engine.dispose()  # new sessions: they count their triggers' time (track_functions)
            with engine.begin() as conn:
                conn.exec_driver_sql("SELECT pg_stat_reset()")
            cpu_started = time.process_time()
            try:
                seconds = write_path(engine, items, 1)
            finally:
                cpu = time.process_time() - cpu_started
                if not counted:
                    with engine.begin() as conn:
                        for trigger in COUNT_TRIGGERS:
                            conn.exec_driver_sql(f"ALTER TABLE site_calls ENABLE TRIGGER {trigger}")
            engine.dispose()  # a backend's function counts reach the view when it exits
            time.sleep(0.5)
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
                in_triggers = conn.execute(
                    sa.text(
                        "SELECT coalesce(sum(total_time), 0) FROM pg_stat_user_functions "
                        "WHERE funcname LIKE 'site_calls_count_%'"
                    )
                ).scalar_one()
            runs.append(
                (
                    round_,
                    counted,
                    len(items) / seconds,
                    1000 * cpu / len(items),
                    float(in_triggers) / len(items),
                    os.getloadavg()[0],
                )
            )
    reset(engine)
    return runs


def explain_kpis(engine: sa.Engine, **scope: str) -> list[str]:
    """The scan lines of the plans of the KPI statements (which index each one uses)."""
    statements: list[tuple[str, Any]] = []
    plans = []
    with engine.connect() as conn:

        def record(*args: Any) -> None:
            statements.append((args[2], args[3]))  # (statement, parameters)

        sa.event.listen(conn, "before_cursor_execute", record)
        measure_kpis(
            conn,
            now=NOW,
            interval=timedelta(hours=1),
            stuck_threshold=timedelta(minutes=10),
            **scope,
        )
        sa.event.remove(conn, "before_cursor_execute", record)
        for statement, parameters in list(statements):
            lines = conn.exec_driver_sql("EXPLAIN " + statement, parameters).scalars().all()
            plans.append(" / ".join(line.strip() for line in lines if "Scan" in line))
    return plans


# --- main ---------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=100_000)
    parser.add_argument("--ids", type=int, default=20_000)
    parser.add_argument("--out-of-order", type=float, default=0.10)
    parser.add_argument("--duplicates", type=float, default=0.10)
    parser.add_argument("--naive-packets", type=int, default=10_000)
    parser.add_argument("--kpi-rows", type=int, default=1_000_000)
    parser.add_argument("--kpi-runs", type=int, default=200)
    parser.add_argument(
        "--in-flight",
        default="3",
        help="comma-separated shares of non-terminal calls, percent of --kpi-rows (1-90)",
    )
    parser.add_argument("--trigger-rounds", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    admin_url = os.environ.get(ADMIN_URL_ENV, DEFAULT_ADMIN_URL)

    raw = generate(args.packets, args.ids, args.out_of_order, args.duplicates, args.seed)
    started = time.perf_counter()
    packets = [validate_packet(p) for p in raw]
    validation = time.perf_counter() - started
    items = [ReceivedPacket(raw=b"", source="bench", packet=p) for p in packets]
    distinct = len({p.tracked_operation_id for p in packets})

    with scratch_database(admin_url) as url:
        engine = create_store_engine(url, pool_size=4)
        upgrade_database(engine)
        if args.trigger_rounds:
            # Time spent in PL/pgSQL functions, the counts' triggers among them, per session
            # (pg_stat_user_functions; superuser setting, the benchmark's own server).
            sa.event.listen(
                engine,
                "connect",
                lambda dbapi, _record: dbapi.execute("SET track_functions = 'pl'"),
            )
        for key, value in environment(engine).items():
            console.print(f"{key}: {value}")
        console.print(
            f"{len(packets):,} packets over {distinct:,} ids, each with an audit event; "
            f"{args.out_of_order:.0%} out of order, {args.duplicates:.0%} duplicates"
        )
        results = []
        for threads in (1, 2):
            reset(engine)
            write_path(engine, items[:400], threads)  # warm up
            reset(engine)
            seconds = write_path(engine, items, threads)
            wrong = check_end_state(engine, packets)
            results.append((f"write path, {threads} batch(es) at once", len(items), seconds, wrong))
        reset(engine)
        sample = packets[: args.naive_packets]
        seconds = naive(engine, sample)
        results.append(
            (
                f"naive: read, decide, write, commit per packet (first {len(sample):,})",
                len(sample),
                seconds,
                check_end_state(engine, sample),
            )
        )

        naive_rate = results[-1][1] / results[-1][2]
        table = Table(title="Telemetry packets per second (PostgreSQL)")
        for column in ("method", "packets", "seconds", "packets/s", "x naive", "rows wrong"):
            table.add_column(column, justify="left" if column == "method" else "right")
        table.add_row(
            "contract validation (CPU only)",
            f"{len(packets):,}",
            f"{validation:.2f}",
            f"{len(packets) / validation:,.0f}",
            "",
            "",
        )
        for name, count, seconds, wrong in results:
            rate = count / seconds
            table.add_row(
                name,
                f"{count:,}",
                f"{seconds:.2f}",
                f"{rate:,.0f}",
                f"{rate / naive_rate:.1f}x",
                str(wrong),
            )
        console.print(table)

        if args.trigger_rounds:
            runs = compare_triggers(engine, items, args.trigger_rounds)
            trigger_table = Table(title="Write path, 1 batch at a time, with / without counts")
            for column in (
                "round",
                "counts' triggers",
                "packets/s",
                "client ms CPU/packet",
                "ms in triggers/packet",
                "load",
            ):
                trigger_table.add_column(column, justify="right")
            for round_, counted, rate, cpu, in_triggers, load in runs:
                trigger_table.add_row(
                    str(round_),
                    "with" if counted else "WITHOUT",
                    f"{rate:,.0f}",
                    f"{cpu:.3f}",
                    f"{in_triggers:.4f}",
                    f"{load:.1f}",
                )
            console.print(trigger_table)
            rates = {(r, c): rate for r, c, rate, *_rest in runs}
            ratios = [
                rates[(r, True)] / rates[(r, False)] for r in range(1, args.trigger_rounds + 1)
            ]
            console.print(
                "with / without the counts' triggers, per round "
                f"{', '.join(f'{v:.2f}' for v in ratios)}; median {statistics.median(ratios):.2f}"
            )

        for in_flight in (int(share) for share in args.in_flight.split(",")):
            load = load_kpi_rows(engine, args.kpi_rows, in_flight)
            console.print(
                f"Loaded {args.kpi_rows:,} site_calls rows, {in_flight} % in flight, in "
                f"{load:.1f} s (INSERT ... SELECT, VACUUM ANALYZE); load average "
                f"{os.getloadavg()[0]:.2f}"
            )
            kpi_table = Table(
                title=f"KPI latency at {args.kpi_rows:,} rows, {in_flight} % in flight "
                f"({args.kpi_runs} runs each, methods alternating)"
            )
            for column in (
                "scope",
                "method",
                "p50 ms",
                "p95 ms",
                "buffered",
                "parked",
                "failed",
                "delivered",
                "stuck",
            ):
                kpi_table.add_column(
                    column, justify="left" if column in ("scope", "method") else "right"
                )
            for label, scope in (
                ("global", {}),
                ("site-07", {"site": "site-07"}),
                ("site-07/site-07-gw-2", {"site": "site-07", "node": "site-07-gw-2"}),
            ):
                for method, (p50, p95, figures) in time_kpis(
                    engine, args.kpi_runs, **scope
                ).items():
                    kpi_table.add_row(
                        label,
                        method,
                        f"{p50:.2f}",
                        f"{p95:.2f}",
                        str(figures["buffered"]),
                        str(figures["parked"]),
                        str(figures["failed_last_interval"]),
                        str(figures["delivered_last_interval"]),
                        str(figures["stuck"]),
                    )
            console.print(kpi_table)
        for plan in explain_kpis(engine):
            console.print(f"plan: {plan}")
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
