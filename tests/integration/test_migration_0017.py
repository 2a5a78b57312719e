"""Migrations 0017 and 0018 on each provider: the stamps stored before 0017 (cut to the
microsecond) read back with a tick of 0, on the partitioned audit log too; both
downgrade and upgrade again."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.tables import audit_log, site_calls
from controlroom.sitecalls.writer import SiteCallWriter
from tests.sitecalls.packets import T0, packet, write

TICKS = {
    "site_calls": ("created_at_tick", "updated_at_tick", "terminal_at_tick"),
    "audit_log": ("occurred_at_tick",),
    "site_reconciliation": ("cursor_updated_at_tick",),
}


def columns(engine: sa.Engine, table: str) -> set[str]:
    return {column["name"] for column in sa.inspect(engine).get_columns(table)}


def test_stamps_stored_before_0017_have_a_tick_of_0(engine: sa.Engine) -> None:
    config = alembic_config(engine)
    op_id = str(uuid.uuid4())
    write(SiteCallWriter(engine), packet("Delivered", op_id=op_id, event_id=str(uuid.uuid4())))
    command.downgrade(config, "0016")
    for table, ticks in TICKS.items():
        assert not set(ticks) & columns(engine, table), table
    assert "site_call_tombstones" not in sa.inspect(engine).get_table_names()

    upgrade_database(engine)
    with engine.connect() as conn:
        call = conn.execute(sa.select(site_calls)).one()
        event = conn.execute(sa.select(audit_log)).one()
    assert (call.updated_at_utc, call.updated_at_tick, call.terminal_at_tick) == (T0, 0, 0)
    assert (event.occurred_at_utc, event.occurred_at_tick) == (T0, 0)
    assert "site_call_tombstones" in sa.inspect(engine).get_table_names()
