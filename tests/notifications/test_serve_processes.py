"""Two ``controlroom serve`` processes on one PostgreSQL database dispatch 1,000 due
notifications to a real HTTP receiver: the receiver counts each notification exactly once
(docs/design.md "Notification outbox": claims with ``FOR UPDATE SKIP LOCKED``)."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import notifications
from controlroom.db.transactions import begin_write
from controlroom.notifications.store import NewNotification, enqueue
from tests.notifications.receivers import webhook_receiver
from tests.notifications.test_serve_kill import environment, serve, wait_for

COUNT = 1000


def delivered(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(sa.func.count()).where(notifications.c.status == "Delivered")
        ).scalar_one()


@pytest.mark.postgresql
def test_two_serve_processes_deliver_each_of_1000_notifications_exactly_once(
    postgresql_url: str, tmp_path: Path
) -> None:
    engine = create_store_engine(postgresql_url)
    try:
        upgrade_database(engine)
        now = datetime.now(UTC)
        with begin_write(engine) as conn:
            ids = {
                enqueue(
                    conn,
                    NewNotification("rule:r", "Webhook", "ops", f"Intake stalled {n}", "60 s"),
                    now=now,
                ).notification_id
                for n in range(COUNT)
            }
        with webhook_receiver() as receiver:
            env = environment(postgresql_url, receiver, tmp_path)
            env["CONTROLROOM_NOTIFICATIONS__BATCH_SIZE"] = "50"
            logs = [tmp_path / "serve-1.log", tmp_path / "serve-2.log"]
            processes = [serve(env, log) for log in logs]
            try:
                for process, log in zip(processes, logs, strict=True):
                    wait_for(lambda: delivered(engine) == COUNT, "1,000 deliveries", process, log)
            finally:
                for process in processes:
                    process.send_signal(signal.SIGTERM)
                for process in processes:
                    try:
                        process.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait()
            received = Counter(request.headers["webhook-id"] for request in receiver.requests)
        assert set(received) == ids  # none missing, none unknown
        assert [name for name, times in received.items() if times > 1] == []  # none twice
    finally:
        engine.dispose()
