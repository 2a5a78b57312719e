"""The audit log's guarantees held by the database (docs/design.md "Audit log"): on
PostgreSQL serve's service role may only insert and read it, and the owner's functions
purge only months past retention; on every provider the hash chain shows a changed event
(`controlroom audit verify`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from controlroom.cli import app
from controlroom.db.audit_chain import GENESIS, ChainWalk, link_events
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import secure_audit_log, upgrade_database
from controlroom.db.providers._postgresql_roles import service_group
from controlroom.db.tables import audit_log
from controlroom.sitecalls.audit_verify import verify_audit_log
from controlroom.sitecalls.writer import SiteCallWriter
from tests import servers
from tests.sitecalls.packets import packet, write


def _events(engine: sa.Engine, *ats: datetime) -> list[str]:
    """Audit events written by the writer (one packet each), their ids in order."""
    ids = [str(uuid.uuid4()) for _ in ats]
    writer = SiteCallWriter(engine)
    for event_id, at in zip(ids, ats, strict=True):
        write(writer, packet("Submitted", op_id=str(uuid.uuid4()), at=at, event_id=event_id))
    return ids


# --- the chain, without a database ---------------------------------------------------------
def _row(event_id: str, at: datetime) -> dict[str, object]:
    return {
        "event_id": event_id,
        "occurred_at_utc": at,
        "occurred_at_tick": 0,
        "ingested_at_utc": at,
        "actor": "site-a",
        "action": "CachedEnqueued",
        "outcome": "Success",
        "category": "SiteCall",
        "target": None,
        "source_site": "a",
        "source_node": None,
        "correlation_id": None,
        "details_json": None,
        "payload_truncated": False,
    }


def test_events_chain_per_month_and_a_change_breaks_the_walk() -> None:
    december, january = datetime(2026, 12, 31, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)
    linked = link_events(
        [_row("a", december), _row("b", january), _row("c", december)], {202612: (4, "f" * 64)}
    )
    assert [(e["chain_month"], e["chain_seq"]) for e in linked] == [
        (202612, 5),
        (202701, 1),
        (202612, 6),
    ]
    fresh = link_events([_row("x", january), _row("y", january)], {})
    walk = ChainWalk()
    assert [walk.check(e) for e in fresh] == [None, None]
    changed = {**fresh[1], "actor": "someone else"}
    walk = ChainWalk()
    assert walk.check(fresh[0]) is None
    broken = walk.check(changed)
    assert broken is not None and broken.event_id == "y" and "hash" in broken.reason
    walk = ChainWalk()
    missing = walk.check(fresh[1])
    assert missing is not None and "missing" in missing.reason
    assert fresh[0]["chain_hash"] != GENESIS


def test_a_chain_must_reach_the_head_an_earlier_walk_recorded() -> None:
    december, january = datetime(2026, 12, 5, tzinfo=UTC), datetime(2027, 1, 5, tzinfo=UTC)
    events = link_events([_row(str(n), december) for n in range(3)] + [_row("j", january)], {})
    first = ChainWalk()
    assert all(first.check(e) is None for e in events) and first.finish() is None

    cut_short = ChainWalk(first.heads)  # the newest December event removed
    assert all(cut_short.check(e) is None for e in events[:2])
    ended = cut_short.check(events[3])
    assert ended is not None and ended.event_id == "1" and "newest events" in ended.reason

    gone = ChainWalk(first.heads)  # January removed whole, not past retention
    assert all(gone.check(e) is None for e in events[:3])
    vanished = gone.finish()
    assert vanished is not None and vanished.chain_month == 202701 and "gone" in vanished.reason
    purged = ChainWalk(first.heads, purgeable_before=202701)  # December purged, in part
    assert all(purged.check(e) is None for e in events[2:]) and purged.finish() is None
    not_purgeable = ChainWalk(first.heads)
    broken = not_purgeable.check(events[2])
    assert broken is not None and "missing" in broken.reason


# --- every provider ------------------------------------------------------------------------
def test_verify_names_an_event_a_privileged_hand_changed(
    engine: sa.Engine, database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    today = datetime.now(UTC)
    ids = _events(engine, today - timedelta(days=40), today, today, today)
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", database_url)
    runner = CliRunner()

    intact = runner.invoke(app, ["audit", "verify"])
    assert intact.exit_code == 0, intact.output
    assert "intact" in intact.output and "4 audit events in 2 monthly chains" in intact.output

    tamper(engine, ids[2])
    broken = runner.invoke(app, ["audit", "verify"])
    assert broken.exit_code == 1
    assert ids[2] in broken.output and "hash does not match" in broken.output
    result = verify_audit_log(engine)
    assert result.broken is not None and result.broken.event_id == ids[2]


def test_verify_counts_one_event_in_one_chain_in_the_singular(
    engine: sa.Engine, database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    _events(engine, datetime.now(UTC))
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", database_url)
    intact = CliRunner().invoke(app, ["audit", "verify"])
    assert intact.exit_code == 0, intact.output
    assert "1 audit event in 1 monthly chain." in intact.output, intact.output


def tamper(engine: sa.Engine, event_id: str) -> None:
    """Change an event's actor past the append-only trigger, as a superuser or a hand
    on the SQLite file could."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only")
            conn.execute(
                sa.update(audit_log).where(audit_log.c.event_id == event_id).values(actor="x")
            )
            conn.exec_driver_sql("ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only")
        else:
            conn.exec_driver_sql("DROP TRIGGER audit_log_no_update")
            conn.execute(
                sa.update(audit_log).where(audit_log.c.event_id == event_id).values(actor="x")
            )


def test_sqlite_permit_deletes_only_months_past_the_floor(tmp_path) -> None:
    engine = create_store_engine(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        upgrade_database(engine)
        today = datetime.now(UTC)
        old, recent = _events(engine, today - timedelta(days=500), today - timedelta(days=5))
        secure_audit_log(engine, retention_days=365, service_url=None)
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO audit_purge_permits (id) VALUES (1)")
            with pytest.raises(sa.exc.IntegrityError, match="append-only"):
                conn.execute(sa.delete(audit_log).where(audit_log.c.event_id == recent))
            conn.execute(sa.delete(audit_log).where(audit_log.c.event_id == old))
    finally:
        engine.dispose()


# --- PostgreSQL: the service role ----------------------------------------------------------
@pytest.fixture
def roles() -> Iterator[tuple[sa.Engine, sa.Engine]]:
    """A migrated database, its owner's engine (a superuser) and the engine of a service
    role `secure_audit_log` made (the floor: 60 days); the roles dropped afterwards."""
    url = servers.create_postgresql_database(migrated=True)
    login, password = servers.scratch_name("svc"), uuid.uuid4().hex
    service_url = sa.make_url(url).set(username=login, password=password)
    owner = create_store_engine(url)
    service = None
    group = service_group(sa.make_url(url).database or "")
    try:
        secure_audit_log(
            owner,
            retention_days=60,
            service_url=service_url.render_as_string(hide_password=False),
        )
        service = create_store_engine(service_url.render_as_string(hide_password=False))
        yield owner, service
    finally:
        if service is not None:
            service.dispose()
        _drop_roles(owner, login, group)
        owner.dispose()
        servers.drop_postgresql_database(url)


def _drop_roles(owner: sa.Engine, *roles: str) -> None:
    """Roles outlive databases: their grants in ``owner``'s database go first, then the
    roles."""
    with owner.begin() as conn:
        for role in roles:
            if conn.exec_driver_sql(
                "SELECT 1 FROM pg_roles WHERE rolname = %(role)s", {"role": role}
            ).first():
                conn.exec_driver_sql(f'DROP OWNED BY "{role}"')
                conn.exec_driver_sql(f'DROP ROLE "{role}"')


def _partitions(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.exec_driver_sql(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'audit_log'::regclass ORDER BY 1"
            ).scalars()
        )


REFUSED = [
    "UPDATE audit_log SET actor = 'x'",
    "DELETE FROM audit_log",
    "TRUNCATE audit_log",
    "UPDATE {partition} SET actor = 'x'",
    "DELETE FROM {partition}",
    "TRUNCATE {partition}",
    "ALTER TABLE audit_log DETACH PARTITION {partition}",
    "DROP TABLE {partition}",
    "ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only",
    "ALTER TABLE audit_log DISABLE TRIGGER ALL",
    "DELETE FROM audit_event_ids",
    "UPDATE audit_log_policy SET min_retention_days = 1",
    "DROP FUNCTION audit_log_purge(integer, integer)",
    "CREATE TABLE audit_log_p209901 PARTITION OF audit_log "
    "FOR VALUES FROM ('2099-01-01') TO ('2099-02-01')",
]


@pytest.mark.postgresql
@pytest.mark.parametrize("statement", REFUSED)
def test_the_service_role_cannot_rewrite_the_audit_log(
    roles: tuple[sa.Engine, sa.Engine], statement: str
) -> None:
    owner, service = roles
    _events(owner, datetime.now(UTC))
    partition = next(p for p in _partitions(owner) if p.startswith("audit_log_p"))
    with (
        pytest.raises(sa.exc.ProgrammingError, match=r"permission denied|must be owner"),
        service.begin() as conn,
    ):
        conn.exec_driver_sql(statement.format(partition=partition))
    with owner.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(audit_log)).scalar_one() == 1


@pytest.mark.postgresql
def test_the_purge_setting_unlocks_nothing_for_the_service_role(
    roles: tuple[sa.Engine, sa.Engine],
) -> None:
    owner, service = roles
    _events(owner, datetime.now(UTC))
    with (
        pytest.raises(sa.exc.ProgrammingError, match="permission denied"),
        service.begin() as conn,
    ):
        conn.exec_driver_sql("SET LOCAL controlroom.audit_purge = 'on'")
        conn.exec_driver_sql("DELETE FROM audit_log")


@pytest.mark.postgresql
def test_the_service_role_writes_reads_and_purges_only_past_the_floor(
    roles: tuple[sa.Engine, sa.Engine],
) -> None:
    owner, service = roles
    upgrade_database(service)  # serve's start: at head, the service role changes nothing
    today = datetime.now(UTC)
    # 45 days: past the retention asked for, not past the floor.
    old, middle = _events(owner, today - timedelta(days=400), today - timedelta(days=45))
    (recent,) = _events(service, today)  # the service role writes through the writer
    from controlroom.db.providers import provider_for

    provider = provider_for(service)
    provider.prepare_audit_log(service)
    deleted, kept_from = provider.purge_audit_log(service, 1)  # asks for 1 day: floor 60
    assert deleted == 1
    assert kept_from <= today - timedelta(days=60)
    with service.connect() as conn:
        kept = set(conn.execute(sa.select(audit_log.c.event_id)).scalars())
    assert kept == {middle, recent} and old not in kept
    assert verify_audit_log(service).intact
    with service.connect() as conn:
        assert provider.audit_log_exposure(conn) is None
    with owner.connect() as conn:
        assert "superuser" in (provider.audit_log_exposure(conn) or "")


@pytest.mark.postgresql
def test_migrate_as_the_owner_makes_serves_user_the_service_role(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    url = servers.create_postgresql_database()
    login = servers.scratch_name("svc")
    service_url = sa.make_url(url).set(username=login, password=uuid.uuid4().hex)
    owner = create_store_engine(url)
    try:
        monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(tmp_path))
        monkeypatch.setenv("CONTROLROOM_MIGRATION_DATABASE_URL", url)
        monkeypatch.setenv(
            "CONTROLROOM_DATABASE_URL", service_url.render_as_string(hide_password=False)
        )
        runner = CliRunner()
        for _ in range(2):  # idempotent
            result = runner.invoke(app, ["migrate"])
            assert result.exit_code == 0, result.output
            assert service_group(owner.url.database or "") in result.output
        service = create_store_engine(service_url.render_as_string(hide_password=False))
        try:
            _events(service, datetime.now(UTC))
            with (
                pytest.raises(sa.exc.ProgrammingError, match="permission denied"),
                service.begin() as conn,
            ):
                conn.exec_driver_sql("DELETE FROM audit_log")
            assert runner.invoke(app, ["audit", "verify"]).exit_code == 0
            # Fresh-user pass (sixth): migrate as the service role failed on the audit
            # policy with the driver's line alone; it says who migrates.
            monkeypatch.delenv("CONTROLROOM_MIGRATION_DATABASE_URL")
            result = runner.invoke(app, ["migrate"])
            assert result.exit_code == 1, result.output
            said = " ".join(result.output.split())
            assert "InsufficientPrivilege: permission denied for table audit_log_policy" in said
            assert (
                "this database user lacks a privilege: the schema's owner migrates "
                "(CONTROLROOM_MIGRATION_DATABASE_URL)"
            ) in said
        finally:
            service.dispose()
    finally:
        _drop_roles(owner, login, service_group(owner.url.database or ""))
        owner.dispose()
        servers.drop_postgresql_database(url)


def test_verify_names_the_newest_events_a_privileged_hand_removed(engine: sa.Engine) -> None:
    from controlroom.sitecalls.audit_verify import record_verification

    today = datetime.now(UTC)
    ids = _events(engine, today, today, today)
    record_verification(engine, verify_audit_log(engine))
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only")
        else:
            conn.exec_driver_sql("DROP TRIGGER audit_log_no_delete")
        conn.execute(sa.delete(audit_log).where(audit_log.c.event_id == ids[2]))
    result = verify_audit_log(engine)
    assert result.broken is not None and result.broken.event_id == ids[1]
    assert "newest events were removed" in result.broken.reason
