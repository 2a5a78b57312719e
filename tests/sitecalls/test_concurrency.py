"""Writers racing one tracked operation (docs/decisions.md "The site-call upsert inserts first").

The first-packet race is driven step by step on two real PostgreSQL connections, in every
interleaving of their statements; a step that blocks on the other's row lock is left
waiting (seen in ``pg_stat_activity``) while the schedule goes on. No timed assertions:
the waits only guard against a hang.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.providers import provider_for
from controlroom.db.tables import audit_log, site_calls
from controlroom.sitecalls.audit_verify import verify_audit_log
from controlroom.sitecalls.upsert import supersedes_stored, upsert_site_calls
from controlroom.sitecalls.writer import SiteCallWriter, audit_row, site_call_row
from tests.sitecalls.packets import T0, packet, received, stored, validated

Step = Callable[[sa.Connection], None]
HANG_GUARD_SECONDS = 30


@pytest.fixture
def pg_engine(postgresql_url: str) -> Iterator[sa.Engine]:
    engine = create_store_engine(postgresql_url)
    upgrade_database(engine)
    try:
        yield engine
    finally:
        engine.dispose()


class SteppedWriter:
    """One connection whose statements run one at a time, when the test says."""

    def __init__(self, engine: sa.Engine) -> None:
        self.conn = engine.connect()
        self.pid = self.conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        self.conn.commit()
        self._thread = ThreadPoolExecutor(max_workers=1)
        self.pending: list[Future[None]] = []

    def submit(self, step: Step) -> Future[None]:
        future = self._thread.submit(step, self.conn)
        self.pending.append(future)
        return future

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self.conn.close()


def wait_done_or_blocked(
    monitor: sa.Connection, writer: SteppedWriter, future: Future[None]
) -> None:
    """Return once ``future`` finished, or its writer waits on a lock (or on an earlier,
    blocked step of its own)."""
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while time.monotonic() < deadline:
        if future.done():
            return
        waiting = monitor.execute(
            sa.text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"),
            {"pid": writer.pid},
        ).scalar_one_or_none()
        if waiting == "Lock":
            return
        time.sleep(0.005)
    raise AssertionError("a step neither finished nor blocked: the schedule hangs")


def insert_first_steps(packet_data: dict[str, Any]) -> list[Step]:
    """The real writer's statements: the monotonic upsert, the audit insert, commit."""
    item = validated(packet_data)
    row, event = site_call_row(item, T0), audit_row(item, T0)

    def upsert(conn: sa.Connection) -> None:
        upsert_site_calls(conn, provider_for(conn), [row])

    def audit(conn: sa.Connection) -> None:
        provider_for(conn).insert_audit_events(conn, [event])

    return [upsert, audit, lambda conn: conn.commit()]


def update_first_steps(packet_data: dict[str, Any]) -> list[Step]:
    """The legs swapped (the bug the insert-first upsert fixed): the guarded UPDATE first, then an
    insert only when the update matched nothing."""
    item = validated(packet_data)
    row = site_call_row(item, T0)
    matched: list[int] = []

    def update(conn: sa.Connection) -> None:
        # The guard reads the incoming row's columns; here they are bound values.
        values = {name: sa.literal(value, site_calls.c[name].type) for name, value in row.items()}
        stand_in = type("Incoming", (), values)
        result = conn.execute(
            sa.update(site_calls)
            .where(site_calls.c.tracked_operation_id == row["tracked_operation_id"])
            .where(supersedes_stored(stand_in))
            .values(**{k: v for k, v in row.items() if k != "tracked_operation_id"})
        )
        matched.append(result.rowcount)

    def insert(conn: sa.Connection) -> None:
        if matched and matched[0] == 0:
            provider = provider_for(conn)
            conn.execute(
                provider.insert_if_absent(site_calls, key=[site_calls.c.tracked_operation_id]),
                [row],
            )

    return [update, insert, lambda conn: conn.commit()]


def run_schedule(engine: sa.Engine, schedule: tuple[int, ...], steps: list[list[Step]]) -> None:
    writers = [SteppedWriter(engine), SteppedWriter(engine)]
    position = [0, 0]
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as monitor:
            for who in schedule:
                step = steps[who][position[who]]
                position[who] += 1
                future = writers[who].submit(step)
                wait_done_or_blocked(monitor, writers[who], future)
        for writer in writers:
            for future in writer.pending:
                future.result(timeout=HANG_GUARD_SECONDS)
    finally:
        for writer in writers:
            writer.close()


SCHEDULES = sorted(set(itertools.permutations((0, 0, 0, 1, 1, 1))))
LOWER = ("Submitted", 1)
HIGHER = ("Attempted", 2)


def _race(engine: sa.Engine, make_steps: Callable[[dict[str, Any]], list[Step]]) -> list[str]:
    """Every schedule, with the higher state first on one side then the other; returns
    the schedules where the higher state did not survive."""
    lost = []
    for schedule in SCHEDULES:
        for first, second in ((LOWER, HIGHER), (HIGHER, LOWER)):
            op_id = str(uuid.uuid4())
            packets = [
                packet(
                    status, op_id=op_id, at=T0 + timedelta(seconds=s), event_id=str(uuid.uuid4())
                )
                for status, s in (first, second)
            ]
            run_schedule(engine, schedule, [make_steps(p) for p in packets])
            if stored(engine, op_id).status != HIGHER[0]:
                lost.append(f"{schedule} {first[0]} vs {second[0]}")
    return lost


@pytest.mark.postgresql
def test_first_packet_race_keeps_the_higher_state_in_every_interleaving(pg_engine) -> None:
    assert len(SCHEDULES) == 20
    assert _race(pg_engine, insert_first_steps) == []
    with pg_engine.connect() as conn:
        # Both writers' audit events were kept, in every schedule.
        assert conn.execute(sa.select(sa.func.count()).select_from(audit_log)).scalar() == 80


@pytest.mark.postgresql
def test_the_race_test_catches_an_upsert_with_its_legs_swapped(pg_engine) -> None:
    # The update-first version loses the higher state whenever both updates run before
    # either insert: the later insert does nothing, so its state is gone.
    assert _race(pg_engine, update_first_steps) != []


def test_fifty_concurrent_inserts_of_one_new_id_make_one_row(engine: sa.Engine) -> None:
    writer = SiteCallWriter(engine)
    op_id = str(uuid.uuid4())
    statuses = ["Submitted", "Forwarded", "Attempted", "Skipped", "Parked"]
    packets = [
        packet(
            statuses[i % 5], op_id=op_id, at=T0 + timedelta(seconds=i), event_id=str(uuid.uuid4())
        )
        for i in range(50)
    ]
    barrier = threading.Barrier(50)
    errors: list[BaseException] = []

    def insert(data: dict[str, Any]) -> None:
        item = received(data)
        barrier.wait()
        try:
            assert writer.write([item]) == [None]
        except BaseException as exc:  # collected, asserted after join
            errors.append(exc)

    threads = [threading.Thread(target=insert, args=(p,)) for p in packets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with engine.connect() as conn:
        assert (
            conn.execute(
                sa.select(sa.func.count())
                .select_from(site_calls)
                .where(site_calls.c.tracked_operation_id == op_id)
            ).scalar()
            == 1
        )
        assert conn.execute(sa.select(sa.func.count()).select_from(audit_log)).scalar() == 50
    # Fifty writers at once linked their events into one chain, without a fork.
    verification = verify_audit_log(engine)
    assert verification.intact and verification.events == 50, verification
    # The highest key: Parked (rank 3) with the newest stamp among the Parked packets.
    row = stored(engine, op_id)
    assert (row.status, row.updated_at_utc) == ("Parked", T0 + timedelta(seconds=49))
