"""The writer's per-batch probes read what they need, not what a group holds.

Two statements every batch runs whatever happens: the new-group probe of the notification
rules (``writer.new_groups``) and the release of retry claims of new failures. As a
``DISTINCT`` over the group index the probe read every row of every group it asked
about, so its cost grew with the table (a group of a storm holds a row per failure);
the release read every message of the batch again although almost no message holds a
claim. Checked on the plans PostgreSQL reports (``EXPLAIN ANALYZE`` of the statement the
writer ran, with its parameters), never on a time; the answers on both providers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from controlroom.db.providers import provider_for
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch, new_groups
from controlroom.errors.model import FailureGroup
from tests.factories import at, attempt

NOW = datetime(2026, 1, 2, tzinfo=UTC)
MESSAGES = 300
STORM = FailureGroup(id="7b0d7a4e-0000-4000-8000-000000000001", classifier="Test", title="storm")
UNSEEN = "7b0d7a4e-0000-4000-8000-000000000002"


def _write_storm(engine: sa.Engine) -> FailedMessageBatchWriter:
    writer = FailedMessageBatchWriter(engine, clock=lambda: NOW)
    writer.write(
        IngestionBatch(attempts=[attempt(n, at(n), groups=(STORM,)) for n in range(MESSAGES)])
    )
    return writer


class _Captured:
    """The last statement matching ``marker`` that ``engine`` ran, with its parameters."""

    def __init__(self, engine: sa.Engine, marker: str) -> None:
        self.statement = ""
        self.parameters: Any = None

        def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
            if marker in statement:
                self.statement, self.parameters = statement, parameters

        sa.event.listen(engine, "before_cursor_execute", capture)


def _plan_nodes(engine: sa.Engine, captured: _Captured) -> Iterator[dict[str, Any]]:
    """Every node of ``EXPLAIN (ANALYZE, FORMAT JSON)`` of the captured statement, run in
    a transaction rolled back."""
    with engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        with raw.cursor() as cursor:
            cursor.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + captured.statement, captured.parameters
            )
            (plan,) = cursor.fetchone()
        conn.rollback()
    plan = plan if isinstance(plan, list) else json.loads(plan)
    stack = [plan[0]["Plan"]]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.get("Plans", []))


def test_the_new_group_probe_finds_only_unseen_groups(engine: sa.Engine) -> None:
    _write_storm(engine)
    with engine.connect() as conn:
        assert new_groups(conn, provider_for(engine), [STORM.id, UNSEEN]) == [UNSEEN]
        assert new_groups(conn, provider_for(engine), []) == []


# The plans are PostgreSQL's: these tests take the PostgreSQL store only (never a skip).
postgresql_only = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


@postgresql_only
def test_the_new_group_probe_reads_one_entry_of_a_known_group(engine: sa.Engine) -> None:
    _write_storm(engine)
    captured = _Captured(engine, "failed_message_groups.group_id")
    with engine.connect() as conn:
        new_groups(conn, provider_for(engine), [STORM.id, UNSEEN])
    read = [
        node["Actual Rows"] * node["Actual Loops"]
        for node in _plan_nodes(engine, captured)
        if node.get("Relation Name") == "failed_message_groups"
    ]
    assert read and sum(read) <= 2, read  # at most one entry per id asked, of 300 rows


@postgresql_only
def test_releasing_claims_reads_no_message_when_no_claim_is_held(engine: sa.Engine) -> None:
    writer = _write_storm(engine)
    captured = _Captured(engine, "DELETE FROM failed_message_retries")
    later = [attempt(n, at(n + 1000), groups=(STORM,)) for n in range(MESSAGES)]
    writer.write(IngestionBatch(attempts=later))
    assert captured.statement
    read = [
        node["Actual Rows"] * node["Actual Loops"]
        for node in _plan_nodes(engine, captured)
        if node.get("Relation Name") == "failed_messages"
    ]
    assert sum(read) == 0, read
