"""A retention sweep that loses a real deadlock replays its chunk (docs/design.md "Transient
failures": deadlocks and serialization failures retry). PostgreSQL only: SQLite takes
its one write lock up front (``BEGIN IMMEDIATE``) and cannot deadlock.

The deadlock: another transaction locks the expired message's row, the sweep deletes the
message's group rows and then waits for the message's row, and the other transaction
then asks for the group rows. The other transaction's ``deadlock_timeout`` is long, so
the sweep is the one PostgreSQL aborts; before, its error ended the whole sweep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlroom.db.engine import create_store_engine
from controlroom.db.tables import FailedMessageStatus, failed_message_groups, failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.retention import SweepResult, sweep_expired_failed_messages
from tests import servers
from tests.factories import at
from tests.retention.test_retention import DAY, PERIOD, remaining, store


@pytest.fixture
def pg_engine() -> Iterator[sa.Engine]:
    url = servers.create_postgresql_database(migrated=True)
    engine = create_store_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()
        servers.drop_postgresql_database(url)


def wait_until_waiting(conn: sa.Connection, statement: str) -> None:
    """Until a session of this database waits for a lock in a statement ``LIKE
    statement`` (at most 30 s)."""
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE :statement"
    )
    deadline = time.monotonic() + 30
    while conn.execute(query, {"statement": statement}).scalar_one() == 0:
        assert time.monotonic() < deadline, f"no statement like {statement!r} waited"
        conn.rollback()  # pg_stat_activity is read once per transaction
        time.sleep(0.05)


def test_a_sweep_that_loses_a_deadlock_replays_its_chunk(
    pg_engine: sa.Engine, tmp_path: Path
) -> None:
    body_store = FileSystemBodyStore(tmp_path / "bodies")
    expired = store(pg_engine, body_store, "old", FailedMessageStatus.ARCHIVED, 20)
    results: list[SweepResult] = []
    errors: list[BaseException] = []

    def sweep() -> None:
        try:
            results.append(
                sweep_expired_failed_messages(
                    pg_engine, body_store, retention_period=PERIOD, now=at(0) + DAY
                )
            )
        except BaseException as exc:  # collected, asserted after the join
            errors.append(exc)

    with pg_engine.connect() as watcher, pg_engine.connect() as other:
        other.exec_driver_sql("SET deadlock_timeout = '60s'")  # the sweep detects it
        other.execute(
            sa.select(failed_messages.c.id).where(failed_messages.c.id == expired).with_for_update()
        )
        sweeper = threading.Thread(target=sweep)
        sweeper.start()
        wait_until_waiting(watcher, "DELETE FROM failed_messages %")
        other.execute(  # waits for the sweep's deleted group rows: a cycle
            sa.select(failed_message_groups.c.group_id)
            .where(failed_message_groups.c.failed_message_id == expired)
            .with_for_update()
        )
        other.rollback()
        sweeper.join(60)
    assert not sweeper.is_alive()
    assert errors == []
    assert results[0].deleted == 1
    assert remaining(pg_engine) == set()
