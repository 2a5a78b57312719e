"""Site notification batches that overlap never deadlock each other (PostgreSQL only:
SQLite takes its one write lock up front): each batch inserts its new rows in id order,
so two batches wait for each other's rows in one order and never in a cycle.

Another transaction inserts the lower id of two (uncommitted); a site posts both, the
higher first; when the post waits, the other transaction inserts the higher id. Had the
post inserted in its given order, it would hold the higher id and wait for the lower: a
cycle, and PostgreSQL aborts the post (the other's ``deadlock_timeout`` is long).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.tables import notifications
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.notifications.store import NewNotification, enqueue
from tests import servers
from tests.notifications.test_site_intake import item
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


def insert(conn: sa.Connection, notification_id: str) -> None:
    fields = item(notification_id=notification_id)
    enqueue(
        conn,
        NewNotification(
            source="site:plant-7",
            channel=fields["channel"],
            target=fields["target"],
            subject=fields["subject"],
            body=fields["body"],
            notification_id=notification_id,
        ),
        now=datetime.now(UTC),
    )


def test_two_overlapping_batches_in_opposite_orders_both_store(
    pg_client: tuple[TestClient, sa.Engine],
) -> None:
    client, engine = pg_client
    low, high = sorted(str(uuid.uuid4()) for _ in range(2))
    answers: list[Any] = []

    def post() -> None:
        batch = [item(notification_id=high), item(notification_id=low)]
        answers.append(client.post("/api/site-notifications", json=batch))

    with engine.connect() as watcher, engine.connect() as other:
        other.exec_driver_sql("SET deadlock_timeout = '60s'")  # the post detects a cycle
        insert(other, low)
        poster = threading.Thread(target=post)
        poster.start()
        wait_until_waiting(watcher, "INSERT INTO notifications %")
        insert(other, high)
        other.commit()
        poster.join(60)
    assert not poster.is_alive()
    (answer,) = answers
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"accepted": [0, 1], "rejected": []}
    with engine.connect() as conn:
        ids = conn.execute(sa.select(notifications.c.notification_id)).scalars().all()
    assert sorted(ids) == [low, high]


def test_many_overlapping_batches_posted_at_once_all_store(
    pg_client: tuple[TestClient, sa.Engine],
) -> None:
    client, engine = pg_client
    ids = [str(uuid.uuid4()) for _ in range(30)]
    posters = 8
    barrier = threading.Barrier(posters)
    answers: list[int] = []

    def post(reverse: bool) -> None:
        batch = [item(notification_id=i) for i in (reversed(ids) if reverse else ids)]
        barrier.wait()
        answers.append(client.post("/api/site-notifications", json=batch).status_code)

    threads = [threading.Thread(target=post, args=(n % 2 == 1,)) for n in range(posters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers == [200] * posters
    with engine.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(notifications)).scalar_one()
    assert count == len(ids)
