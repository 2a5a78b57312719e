"""PostgreSQL plans the group counts' status trigger for the statement that fires it.

Migration 0014's ``failed_messages_count_status`` joins the statement's transition
tables with each other and with the group rows. As a static statement of a ``plpgsql``
function it was planned once per connection, on the first call, and that plan kept: for
the writer's small upserts on a fresh database (an empty table of group rows, a few rows
in the transition tables), so a later bulk status change (a retry of 1,000 messages)
ran nested loops over both transition tables and over every group row, seconds where
milliseconds do. Since migration 0016 the statement is planned on each call, knowing the
transition tables' sizes. Checked on the plan PostgreSQL reports (``auto_explain`` of the
nested statement), never on a time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from tests.factories import at, attempt

NOW = datetime(2026, 1, 2, tzinfo=UTC)
MESSAGES = 1_000
SCAN = re.compile(r"Named Tuplestore Scan .*\(cost=\S+ rows=(\d+) .*\(actual .*rows=(\d+) ")


@pytest.fixture
def pg_engine(postgresql_url: str) -> Iterator[sa.Engine]:
    """A store at head on PostgreSQL (the trigger is PostgreSQL's), one pooled connection."""
    engine = create_store_engine(postgresql_url, pool_size=1)
    upgrade_database(engine)
    try:
        yield engine
    finally:
        engine.dispose()


def test_a_bulk_status_change_counts_its_groups_with_a_plan_for_its_size(
    pg_engine: sa.Engine,
) -> None:
    writer = FailedMessageBatchWriter(pg_engine, clock=lambda: NOW)
    writer.write(IngestionBatch(attempts=[attempt(n, at(n)) for n in range(MESSAGES)]))
    plans: list[str] = []
    with pg_engine.connect() as conn:
        fm = failed_messages.c
        first = sa.select(fm.id).order_by(fm.id).limit(1).scalar_subquery()
        archived = int(FailedMessageStatus.ARCHIVED)
        # One small status change first: the plan a static statement would keep.
        conn.execute(failed_messages.update().where(fm.id == first).values(status=archived))
        conn.exec_driver_sql("LOAD 'auto_explain'")
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_analyze = on",
            "client_min_messages = log",
        ):
            conn.exec_driver_sql(f"SET LOCAL {setting}")
        conn.connection.driver_connection.add_notice_handler(
            lambda notice: plans.append(notice.message_primary or "")
        )
        resolved = int(FailedMessageStatus.RESOLVED)
        changed = conn.execute(
            failed_messages.update().where(fm.status != archived).values(status=resolved)
        ).rowcount
        conn.rollback()
    assert changed == MESSAGES - 1
    [plan] = [p for p in plans if "INSERT INTO failed_message_group_counts" in p]
    scans = SCAN.findall(plan)
    assert scans, plan
    # Each transition table is estimated at the rows it holds.
    assert all(int(estimated) == int(actual) == MESSAGES - 1 for estimated, actual in scans), plan
