"""The site-call purge (issue 10 "Tests", "Retention"), on every provider."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.migrate import secure_audit_log
from controlroom.db.tables import audit_log
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


def test_a_shorter_audit_retention_is_honoured_by_whole_months(
    engine: sa.Engine, tmp_path
) -> None:
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


def _months_before(moment: datetime, months: int) -> datetime:
    """``moment`` (a day that every month has) ``months`` months earlier."""
    index = moment.year * 12 + moment.month - 1 - months
    return moment.replace(year=index // 12, month=index % 12 + 1)
