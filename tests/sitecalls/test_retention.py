"""The site-call purge (docs/design.md "Site call retention"), on every provider."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.tables import audit_log, rejected_telemetry
from controlroom.sitecalls.kpis import measure_kpis
from controlroom.sitecalls.retention import SiteCallRetention
from controlroom.sitecalls.writer import SiteCallWriter
from tests.sitecalls.packets import T0, packet, stored, write

NOW = T0 + timedelta(days=400)


def test_purge_deletes_terminal_old_calls_and_old_audit_events_only(
    engine: sa.Engine, tmp_path
) -> None:
    old = T0  # 400 days before NOW
    recent = NOW - timedelta(days=10)
    cases = {
        "delivered-old": ("Delivered", old, False),
        "failed-old": ("Failed", old, False),
        "discarded-old": ("Discarded", old, False),
        "parked-old": ("Parked", old, True),
        "attempted-old": ("Attempted", old, True),
        "delivered-recent": ("Delivered", recent, True),
    }
    ids = {name: str(uuid.uuid4()) for name in cases}
    old_event, recent_event = str(uuid.uuid4()), str(uuid.uuid4())
    writer = SiteCallWriter(engine)
    write(
        writer, *(packet(status, op_id=ids[name], at=at) for name, (status, at, _) in cases.items())
    )
    write(writer, packet("Submitted", op_id=str(uuid.uuid4()), at=old, event_id=old_event))
    write(writer, packet("Submitted", op_id=str(uuid.uuid4()), at=recent, event_id=recent_event))

    settings = Settings(data_dir=tmp_path)  # 365 days for both, the defaults
    result = SiteCallRetention(engine, settings, clock=lambda: NOW).purge_once()

    assert result is not None and (result.site_calls, result.audit_events) == (3, 1)
    for name, (_, _, kept) in cases.items():
        assert (stored(engine, ids[name]) is not None) == kept, name
    with engine.connect() as conn:
        assert conn.execute(sa.select(audit_log.c.event_id)).scalars().all() == [recent_event]


def test_a_shorter_audit_retention_is_honoured(engine: sa.Engine, tmp_path) -> None:
    event = str(uuid.uuid4())
    write(SiteCallWriter(engine), packet("Submitted", at=NOW - timedelta(days=40), event_id=event))
    settings = Settings(data_dir=tmp_path, audit={"retention_days": 30})
    result = SiteCallRetention(engine, settings, clock=lambda: NOW).purge_once()
    assert result is not None and result.audit_events == 1


@pytest.mark.postgresql
def test_postgresql_drops_whole_month_partitions(postgresql_url: str, tmp_path) -> None:
    from controlroom.db.engine import create_store_engine
    from controlroom.db.migrate import upgrade_database
    from controlroom.db.providers import provider_for

    january, february, march = (datetime(2025, m, 15, tzinfo=UTC) for m in (1, 2, 3))
    now = datetime(2025, 3, 25, tzinfo=UTC)  # 30 days: the cutoff is 2025-02-23
    engine = create_store_engine(postgresql_url)
    try:
        upgrade_database(engine)
        provider_for(engine).prepare_audit_log(engine, january)  # January to March
        events = {at: str(uuid.uuid4()) for at in (january, february, march)}
        writer = SiteCallWriter(engine)
        for at, event in events.items():
            write(writer, packet("Submitted", op_id=str(uuid.uuid4()), at=at, event_id=event))
        with engine.connect() as conn:
            placed = dict(
                conn.exec_driver_sql(
                    "SELECT event_id, tableoid::regclass::text FROM audit_log"
                ).all()
            )
        assert placed[events[january]] == "audit_log_p202501"

        settings = Settings(data_dir=tmp_path, audit={"retention_days": 30})
        result = SiteCallRetention(engine, settings, clock=lambda: now).purge_once()

        assert result is not None and result.audit_events == 1
        with engine.connect() as conn:
            kept = set(conn.execute(sa.select(audit_log.c.event_id)).scalars())
            claims = set(conn.exec_driver_sql("SELECT event_id FROM audit_event_ids").scalars())
            partitions = set(
                conn.exec_driver_sql(
                    "SELECT relname FROM pg_class WHERE relname LIKE 'audit_log_p2025%%'"
                ).scalars()
            )
        # February's event is older than the cutoff but its month is not over by then: a
        # month is dropped whole, so an event is kept up to a month past its retention.
        assert kept == claims == {events[february], events[march]}
        assert "audit_log_p202501" not in partitions and "audit_log_p202502" in partitions
        # The purge made the partitions of the months ahead of its clock.
        assert {"audit_log_p202504", "audit_log_p202505"} <= partitions
    finally:
        engine.dispose()


def _kpis(engine: sa.Engine) -> dict[str, float | int | None]:
    with engine.connect() as conn:
        report = measure_kpis(
            conn, now=NOW, interval=timedelta(hours=1), stuck_threshold=timedelta(minutes=10)
        )
    return report.total().as_dict(NOW)


def test_a_late_packet_of_a_purged_call_is_rejected_until_its_tombstone_expires(
    engine: sa.Engine, tmp_path
) -> None:
    op_id = str(uuid.uuid4())
    writer = SiteCallWriter(engine)
    write(writer, packet("Submitted", op_id=op_id), packet("Delivered", op_id=op_id))
    settings = Settings(data_dir=tmp_path, sitecalls={"tombstone_days": 30})
    now = [NOW]
    retention = SiteCallRetention(engine, settings, clock=lambda: now[0])
    result = retention.purge_once()
    assert result is not None and result.site_calls == 1
    before = _kpis(engine)

    late = packet(
        "Attempted", op_id=op_id, at=T0 - timedelta(seconds=5), event_id=str(uuid.uuid4())
    )
    (reason,) = write(writer, late)
    assert reason is not None and reason.startswith("tracked_operation_id:")
    assert "purged" in reason and "sitecalls.tombstone_days" in reason
    assert stored(engine, op_id) is None
    assert _kpis(engine) == before
    with engine.connect() as conn:
        kept = conn.execute(sa.select(rejected_telemetry.c.reason)).scalars().all()
        assert kept == [reason]
        assert conn.execute(sa.select(audit_log.c.event_id)).scalars().all() == []

    # tombstone_days after the purge, the tombstone goes and the id is taken again.
    now[0] = NOW + timedelta(days=30, seconds=1)
    result = retention.purge_once()
    assert result is not None and result.tombstones == 1
    assert write(writer, late) == [None]
    assert stored(engine, op_id).status == "Attempted"
