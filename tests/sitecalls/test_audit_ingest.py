"""Audit log ingest: widths refused never truncated, first write wins, append-only in the
database, budgets with a per-row fallback (docs/design.md "Audit log"), on every provider."""

from __future__ import annotations

import itertools
import json
import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from controlroom.db.tables import audit_log, rejected_telemetry
from controlroom.db.transactions import begin_write
from controlroom.sitecalls.writer import ReceivedPacket, SiteCallWriter
from tests.sitecalls.packets import T0, packet, received, stored, validated, write


def ids(n: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(n)]


def rejected_rows(engine: sa.Engine) -> list[sa.Row]:
    with engine.connect() as conn:
        return conn.execute(sa.select(rejected_telemetry)).all()


def test_a_257_character_target_is_rejected_on_the_chunk_path(engine: sa.Engine) -> None:
    before, bad, after = ids(3)
    too_long = "t" * 257
    reasons = write(
        SiteCallWriter(engine),
        packet("Submitted", op_id=before),
        packet("Submitted", op_id=bad, target=too_long),
        packet("Submitted", op_id=after),
    )
    assert reasons[0] is None and reasons[2] is None
    assert reasons[1] is not None and reasons[1].startswith("target:")
    assert stored(engine, bad) is None
    assert stored(engine, before) is not None and stored(engine, after) is not None
    (kept,) = rejected_rows(engine)
    assert json.loads(kept.packet)["target"] == too_long  # whole, not truncated
    assert kept.reason == reasons[1]


def test_a_257_character_target_is_refused_by_the_store_on_the_per_row_path(
    engine: sa.Engine,
) -> None:
    # Past the contract (as if a caller skipped it): the store itself refuses the width
    # (PostgreSQL varchar(256); SQLite the CHECK of migration 0005), the chunk fails, and
    # the per-row fallback isolates the packet.
    before, bad, after = ids(3)
    good = validated(packet("Submitted", op_id=bad))
    forged = good.model_construct(**{**dict(good), "target": "t" * 257})
    items = [
        received(packet("Submitted", op_id=before)),
        ReceivedPacket(raw=b'{"forged": true}', source="test", packet=forged),
        received(packet("Submitted", op_id=after)),
    ]
    reasons = SiteCallWriter(engine).write(items)
    assert reasons[0] is None and reasons[2] is None
    assert (
        reasons[1]
        == "target: longer than its column's 256 characters (the store refused the packet)"
    )
    assert stored(engine, bad) is None
    assert stored(engine, before) is not None and stored(engine, after) is not None
    (kept,) = rejected_rows(engine)
    assert kept.packet == b'{"forged": true}'


@pytest.mark.parametrize(
    "target", ["t" * 256, "€" * 256, "😀" * 256], ids=["ascii", "3-byte", "4-byte"]
)
def test_a_target_at_the_limit_round_trips_exactly(engine: sa.Engine, target: str) -> None:
    (op_id,) = ids(1)
    assert write(SiteCallWriter(engine), packet("Submitted", op_id=op_id, target=target)) == [None]
    assert stored(engine, op_id).target == target


def test_a_duplicate_event_id_keeps_the_first_write(engine: sa.Engine) -> None:
    writer = SiteCallWriter(engine)
    (event_id,) = ids(1)
    first = packet("Submitted", event_id=event_id)
    second = packet("Forwarded", at=T0 + timedelta(seconds=1), event_id=event_id)
    second["audit_event"]["actor"] = "someone else"
    third = packet("Attempted", at=T0 + timedelta(seconds=2), event_id=event_id)
    third["audit_event"]["action"] = "Rewritten"
    assert write(writer, first) == [None]
    assert write(writer, second, third) == [None, None]
    with engine.connect() as conn:
        (row,) = conn.execute(sa.select(audit_log)).all()
    assert (row.actor, row.action) == ("site-a/node-1", "CallSubmitted")
    assert stored(engine).status == "Attempted"  # the packets themselves were applied


def test_the_ingest_path_cannot_update_or_delete_an_audit_row(engine: sa.Engine) -> None:
    (event_id,) = ids(1)
    write(SiteCallWriter(engine), packet("Submitted", event_id=event_id))
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), begin_write(engine) as conn:
        conn.execute(sa.update(audit_log).values(actor="tampered"))
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), begin_write(engine) as conn:
        conn.execute(sa.delete(audit_log))
    with engine.connect() as conn:
        assert conn.execute(sa.select(audit_log.c.actor)).scalar_one() == "site-a/node-1"


def budget_failures() -> float:
    return REGISTRY.get_sample_value("controlroom_sitecall_ingest_budget_exceeded_total") or 0.0


def test_a_chunk_past_its_budget_falls_back_to_rows_with_a_fresh_budget(engine: sa.Engine) -> None:
    # The clock jumps 100 s once the chunk has started: its 20 s budget is blown before
    # its first statement; each row then gets a fresh 5 s from the new time.
    ticks = itertools.chain([0.0], itertools.repeat(100.0))
    writer = SiteCallWriter(engine, chunk_budget=20, row_budget=5, monotonic=lambda: next(ticks))
    op_ids = ids(3)
    before = budget_failures()
    reasons = write(
        writer, *(packet("Forwarded", op_id=i, event_id=str(uuid.uuid4())) for i in op_ids)
    )
    assert reasons == [None, None, None]
    assert budget_failures() == before + 1  # one failure for the chunk, not one per row
    assert all(stored(engine, i).status == "Forwarded" for i in op_ids)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(audit_log)).scalar() == 3


@pytest.mark.postgresql
def test_a_statement_blocked_past_the_budget_is_cancelled_and_counted_once(
    postgresql_url: str,
) -> None:
    # Another transaction holds the row: the upsert waits until PostgreSQL cancels it at
    # the budget (statement_timeout), the fallback's fresh budget expires the same way,
    # and the writer gives up without committing anything.
    from controlroom.db.engine import create_store_engine
    from controlroom.db.migrate import upgrade_database
    from controlroom.db.tables import site_calls
    from controlroom.sitecalls.writer import IngestBudgetExceeded

    engine = create_store_engine(postgresql_url)
    try:
        upgrade_database(engine)
        write(SiteCallWriter(engine), packet("Submitted"))
        writer = SiteCallWriter(engine, chunk_budget=0.3, row_budget=0.3)
        before = budget_failures()
        with engine.connect() as holder:
            holder.execute(sa.select(site_calls).with_for_update())
            with pytest.raises(IngestBudgetExceeded):
                write(writer, packet("Forwarded", at=T0 + timedelta(seconds=1)))
            holder.rollback()
        assert budget_failures() == before + 2  # the chunk once, the lone packet once
        assert stored(engine).status == "Submitted"
    finally:
        engine.dispose()
