"""Migration 0019 on each provider: the audit events stored before it are chained (a
verify finds them intact), later ones continue their months' chains, and a downgrade
gives 0018's schema back."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import audit_log
from controlroom.sitecalls.audit_verify import verify_audit_log
from controlroom.sitecalls.writer import SiteCallWriter
from tests.sitecalls.packets import packet, write


def _write_events(engine: sa.Engine, *ats: datetime) -> None:
    writer = SiteCallWriter(engine)
    for at in ats:
        write(
            writer, packet("Submitted", op_id=str(uuid.uuid4()), at=at, event_id=str(uuid.uuid4()))
        )


def test_0019_chains_the_events_stored_before_it(engine: sa.Engine) -> None:
    config = alembic_config(engine)
    command.downgrade(config, "0018")
    now = datetime.now(UTC)
    columns = [c for c in audit_log.c if not c.name.startswith("chain_")]
    with engine.begin() as conn:  # 0018's audit log, as its writer filled it
        conn.execute(
            sa.insert(sa.table("audit_log", *[sa.column(c.name, c.type) for c in columns])),
            [
                {
                    "event_id": str(uuid.uuid4()),
                    "occurred_at_utc": now - timedelta(days=n * 20),
                    "ingested_at_utc": now,
                    "actor": f"node-{n}",
                    "action": "CachedEnqueued",
                    "outcome": "Success",
                    "category": "SiteCall",
                    "target": None,
                    "source_site": "a",
                    "source_node": None,
                    "correlation_id": None,
                    "details_json": '{"n": 1}',
                    "payload_truncated": n % 2 == 0,
                    "occurred_at_tick": n,
                }
                for n in range(4)
            ],
        )

    upgrade_database(engine)
    _write_events(engine, now, now - timedelta(days=20))

    result = verify_audit_log(engine)
    assert result.intact and result.events == 6, result
    command.downgrade(config, "0018")
    with engine.connect() as conn:
        assert (
            conn.execute(sa.select(sa.func.count()).select_from(sa.table("audit_log"))).scalar()
            == 6
        )
    upgrade_database(engine)
    assert verify_audit_log(engine).intact
