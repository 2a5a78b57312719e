"""Archiving a group or one message, and resolving pending retries by time range,
replay their transaction when it loses a real deadlock (docs/design.md "Transient
failures"). PostgreSQL only: SQLite takes its one write lock up front.

The deadlock: another transaction locks the group row of the group's one message; the
archive updates the message, and its update trigger (migration 0011) waits for that group
row; the other transaction then asks for the message's row. The other transaction's
``deadlock_timeout`` is long, so the archive is the one PostgreSQL aborts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.tables import FailedMessageStatus, failed_message_groups, failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.retries import requests
from tests import servers
from tests.factories import at, attempt, message_uuid
from tests.retention.test_sweep_deadlock import wait_until_waiting


@pytest.fixture
def pg_client(tmp_path: Path) -> Iterator[tuple[TestClient, sa.Engine]]:
    url = servers.create_postgresql_database(migrated=True)
    settings = Settings(data_dir=tmp_path / "data", database_url=url)
    engine = create_store_engine(url)
    try:
        with TestClient(
            create_app(settings, engine, FileSystemBodyStore(settings.body_dir))
        ) as client:
            yield client, engine
    finally:
        engine.dispose()
        servers.drop_postgresql_database(url)


def answer_after_losing_a_deadlock(
    engine: sa.Engine, message_id: str, request: Callable[[], Any]
) -> Any:
    """``request()``'s answer when its update of message ``message_id`` loses a deadlock:
    another transaction holds the message's group row, waits until the request waits for
    it, then asks for the message's row. Its ``deadlock_timeout`` is long, so PostgreSQL
    aborts the request's transaction."""
    answers: list[Any] = []
    with engine.connect() as watcher, engine.connect() as other:
        other.exec_driver_sql("SET deadlock_timeout = '60s'")  # the request detects it
        other.execute(
            sa.select(failed_message_groups.c.group_id)
            .where(failed_message_groups.c.failed_message_id == message_id)
            .with_for_update()
        )
        requester = threading.Thread(target=lambda: answers.append(request()))
        requester.start()
        wait_until_waiting(watcher, "UPDATE failed_messages %")
        other.execute(  # waits for the request's message row: a cycle
            sa.select(failed_messages.c.id)
            .where(failed_messages.c.id == message_id)
            .with_for_update()
        )
        other.rollback()
        requester.join(60)
    assert not requester.is_alive()
    return answers[0]


def stored_status(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(failed_messages.c.status)).scalar_one())


@pytest.mark.parametrize(
    "path",
    [
        "/api/recoverability/groups/{group_id}/errors/archive",
        "/api/errors/{message_id}/archive",
    ],
)
def test_an_archive_that_loses_a_deadlock_replays_it(
    pg_client: tuple[TestClient, sa.Engine], path: str
) -> None:
    client, engine = pg_client
    message = attempt(0, at(0))
    FailedMessageBatchWriter(engine).write(IngestionBatch(attempts=[message]))
    group_id, message_id = message.groups[0].id, message_uuid(0)
    url = path.format(group_id=group_id, message_id=message_id)
    answer = answer_after_losing_a_deadlock(engine, message_id, lambda: client.post(url))
    assert answer.status_code == 202, answer.text
    assert answer.json()["changed"] == 1
    assert stored_status(engine) == int(FailedMessageStatus.ARCHIVED)


def test_resolving_by_time_range_replays_a_lost_deadlock(
    pg_client: tuple[TestClient, sa.Engine],
) -> None:
    """Resolving pending retries by a time range, in the same cycle (break-it pass)."""
    client, engine = pg_client
    FailedMessageBatchWriter(engine).write(IngestionBatch(attempts=[attempt(0, at(0))]))
    message_id = message_uuid(0)
    requests.retry_message(engine, message_id)
    body = {"from": "2000-01-01T00:00:00Z", "to": "2100-01-01T00:00:00Z"}
    answer = answer_after_losing_a_deadlock(
        engine, message_id, lambda: client.patch("/api/pendingretries/resolve", json=body)
    )
    assert answer.status_code in (200, 202), answer.text
    assert answer.json()["changed"] == 1
    assert stored_status(engine) == int(FailedMessageStatus.RESOLVED)
