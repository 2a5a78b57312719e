"""The site-call purge (docs/design.md "Site call retention"), on every provider."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.migrate import secure_audit_log
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
    writer = SiteCallWriter(engine)
    write(
        writer, *(packet(status, op_id=ids[name], at=at) for name, (status, at, _) in cases.items())
    )
    # The audit purge reads the database's clock, not the process's.
    today = datetime.now(UTC)
    old_event, recent_event = str(uuid.uuid4()), str(uuid.uuid4())
    write(writer, _event(old_event, today - timedelta(days=400)))
    write(writer, _event(recent_event, today - timedelta(days=10)))

    settings = Settings(data_dir=tmp_path)  # 365 days for both, the defaults
    result = SiteCallRetention(engine, settings, clock=lambda: NOW).purge_once()

    assert result is not None and (result.site_calls, result.audit_events) == (3, 1)
    for name, (_, _, kept) in cases.items():
        assert (stored(engine, ids[name]) is not None) == kept, name
    with engine.connect() as conn:
        assert conn.execute(sa.select(audit_log.c.event_id)).scalars().all() == [recent_event]


def _event(event_id: str, at: datetime) -> dict[str, object]:
    """A packet of a fresh call carrying the audit event ``event_id`` at ``at``."""
    return packet("Submitted", op_id=str(uuid.uuid4()), at=at, event_id=event_id)


def test_a_shorter_audit_retention_is_honoured_by_whole_months(engine: sa.Engine, tmp_path) -> None:
    today = datetime.now(UTC)
    gone, kept = str(uuid.uuid4()), str(uuid.uuid4())
    write(SiteCallWriter(engine), _event(gone, today - timedelta(days=100)), _event(kept, today))
    settings = Settings(data_dir=tmp_path, audit={"retention_days": 30})
    result = SiteCallRetention(engine, settings, clock=lambda: today).purge_once()
    assert result is not None and result.audit_events == 1
    # The first month kept is the month of 30 days ago: whole months go, none in part.
    first_kept = (today - timedelta(days=30)).replace(day=1, hour=0, minute=0, second=0)
    assert result.audit_cutoff == first_kept.replace(microsecond=0)
    with engine.connect() as conn:
        assert conn.execute(sa.select(audit_log.c.event_id)).scalars().all() == [kept]


def test_no_purge_goes_below_the_floor_the_owner_set(engine: sa.Engine, tmp_path) -> None:
    today = datetime.now(UTC)
    event = str(uuid.uuid4())
    write(SiteCallWriter(engine), _event(event, today - timedelta(days=100)))
    secure_audit_log(engine, retention_days=365, service_url=None)
    settings = Settings(data_dir=tmp_path, audit={"retention_days": 30})
    result = SiteCallRetention(engine, settings, clock=lambda: today).purge_once()
    assert result is not None and result.audit_events == 0
    with engine.connect() as conn:
        assert conn.execute(sa.select(audit_log.c.event_id)).scalars().all() == [event]


@pytest.mark.postgresql
def test_postgresql_drops_whole_month_partitions(postgresql_url: str, tmp_path) -> None:
    from controlroom.db.engine import create_store_engine
    from controlroom.db.migrate import upgrade_database

    today = datetime.now(UTC)
    this_month = today.replace(day=15)
    old_months = [_months_before(this_month, n) for n in (4, 3)]
    engine = create_store_engine(postgresql_url)
    try:
        upgrade_database(engine)
        with engine.begin() as conn:  # as the owner, as a partition from before
            for month in old_months:
                start, end = month.replace(day=1), _months_before(month, -1).replace(day=1)
                conn.exec_driver_sql(
                    f"CREATE TABLE audit_log_p{start:%Y%m} PARTITION OF audit_log "
                    f"FOR VALUES FROM ('{start:%Y-%m-%d}') TO ('{end:%Y-%m-%d}')"
                )
        events = {at: str(uuid.uuid4()) for at in (*old_months, this_month)}
        writer = SiteCallWriter(engine)
        for at, event in events.items():
            write(writer, _event(event, at))
        with engine.connect() as conn:
            placed = dict(
                conn.exec_driver_sql(
                    "SELECT event_id, tableoid::regclass::text FROM audit_log"
                ).all()
            )
        assert placed[events[old_months[0]]] == f"audit_log_p{old_months[0]:%Y%m}"

        settings = Settings(data_dir=tmp_path, audit={"retention_days": 30})
        result = SiteCallRetention(engine, settings, clock=lambda: today).purge_once()

        assert result is not None and result.audit_events == 2
        with engine.connect() as conn:
            kept = set(conn.execute(sa.select(audit_log.c.event_id)).scalars())
            claims = set(conn.exec_driver_sql("SELECT event_id FROM audit_event_ids").scalars())
            partitions = set(
                conn.exec_driver_sql(
                    "SELECT relname FROM pg_class WHERE relname LIKE 'audit_log_p%%'"
                ).scalars()
            )
        assert kept == claims == {events[this_month]}
        assert not {f"audit_log_p{month:%Y%m}" for month in old_months} & partitions
        # The purge made the partitions of the months ahead of the server's clock.
        ahead = {f"audit_log_p{_months_before(this_month, -n):%Y%m}" for n in (0, 1, 2)}
        assert ahead <= partitions
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


def _months_before(moment: datetime, months: int) -> datetime:
    """``moment`` (a day that every month has) ``months`` months earlier."""
    index = moment.year * 12 + moment.month - 1 - months
    return moment.replace(year=index // 12, month=index % 12 + 1)
