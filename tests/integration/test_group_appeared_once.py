"""A new failure group is announced once (docs/design.md "Notification rules": a storm of
failures of one group is one ``FailureGroupAppeared``), also when two batches bring its
first messages at once, on every provider. Second breaker pass: on PostgreSQL 4 of 6 new
groups were announced twice, each batch having found the group without rows while the
other's were not committed yet.

The two batches are driven step by step on two connections: batch A stops after
inserting its group rows, uncommitted, until batch B has asked which of its groups are
new (or two seconds passed: on SQLite B waits for A's write lock instead)."""

from __future__ import annotations

import threading
import uuid

import sqlalchemy as sa

from controlroom.db.tables import event_log_items
from controlroom.errors.ingest.grouping import EXCEPTION_TYPE_AND_STACK_TRACE
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailureGroup
from tests.factories import at, attempt

WAIT_SECONDS = 2.0


def test_a_group_two_batches_bring_at_once_appears_once(engine: sa.Engine) -> None:
    group = FailureGroup(
        id=str(uuid.uuid4()), classifier=EXCEPTION_TYPE_AND_STACK_TRACE, title="E: boom"
    )
    a_inserted, b_asked = threading.Event(), threading.Event()
    roles: dict[int, str] = {}

    @sa.event.listens_for(engine, "after_cursor_execute")
    def step(conn: object, cursor: object, statement: str, *args: object) -> None:
        role = roles.get(threading.get_ident())
        text = " ".join(statement.split()).upper()
        if role == "A" and text.startswith("INSERT INTO FAILED_MESSAGE_GROUPS"):
            a_inserted.set()
            b_asked.wait(WAIT_SECONDS)
        elif role == "B" and text.startswith("SELECT") and "FAILED_MESSAGE_GROUPS" in text:
            b_asked.set()

    def write(role: str, n: int) -> None:
        roles[threading.get_ident()] = role
        FailedMessageBatchWriter(engine).write(
            IngestionBatch(attempts=[attempt(n, at(n), groups=(group,))])
        )

    try:
        a = threading.Thread(target=write, args=("A", 0))
        a.start()
        assert a_inserted.wait(30)
        b = threading.Thread(target=write, args=("B", 1))
        b.start()
        a.join(30)
        b.join(30)
    finally:
        sa.event.remove(engine, "after_cursor_execute", step)

    with engine.connect() as conn:
        appeared = conn.execute(
            sa.select(sa.func.count())
            .select_from(event_log_items)
            .where(event_log_items.c.event_type == "FailureGroupAppeared")
        ).scalar_one()
    assert appeared == 1
