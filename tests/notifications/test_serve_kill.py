"""A ``controlroom serve`` killed with SIGKILL between its claim of a notification and
the outcome: after a restart the notification is sent again, with the same id, and
delivered (at least once, never lost). Every provider."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from controlroom.db.tables import notifications
from controlroom.db.transactions import begin_write
from controlroom.notifications.store import NewNotification, enqueue
from tests.notifications.receivers import WebhookReceiver, webhook_receiver

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
CONTROLROOM_EXE = Path(sys.executable).with_name("controlroom")
DEADLINE_SECONDS = 120.0  # a guard against a hang, not a measurement


def serve(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as output:
        return subprocess.Popen(
            [str(CONTROLROOM_EXE), "serve", "--port", "0"],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
        )


def wait_for(
    condition: Callable[[], object], what: str, process: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        assert process.poll() is None, f"serve exited: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"{what} never happened: {log.read_text()[-2000:]}"
        time.sleep(0.05)


def status_of(engine: sa.Engine, notification_id: str) -> str:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(notifications.c.status).where(
                notifications.c.notification_id == notification_id
            )
        ).scalar_one()


def test_a_notification_claimed_by_a_killed_serve_is_sent_again_after_restart(
    engine: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    with begin_write(engine) as conn:
        notification_id = enqueue(
            conn,
            NewNotification("rule:r", "Webhook", "ops", "Intake stalled", "60 s"),
            now=datetime.now(UTC),
        ).notification_id
    with webhook_receiver() as receiver:
        env = environment(database_url, receiver, tmp_path)
        receiver.hang = True  # the first send never gets its answer
        first = serve(env, tmp_path / "serve-1.log")
        try:
            wait_for(lambda: receiver.requests, "the first send", first, tmp_path / "serve-1.log")
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        assert status_of(engine, notification_id) == "Pending"  # claimed, no outcome
        receiver.hang = False
        receiver.release.set()
        second = serve(env, tmp_path / "serve-2.log")
        try:
            wait_for(
                lambda: status_of(engine, notification_id) == "Delivered",
                "the delivery after the restart",
                second,
                tmp_path / "serve-2.log",
            )
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=60)
        ids = [request.headers["webhook-id"] for request in receiver.requests]
        assert ids == [notification_id, notification_id]
        assert receiver.requests[0].body == receiver.requests[1].body


def environment(database_url: str, receiver: WebhookReceiver, tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "CONTROLROOM_DATA_DIR": str(tmp_path / "data"),
        "CONTROLROOM_DATABASE_URL": database_url,
        "CONTROLROOM_INGEST_ON_SERVE": "false",
        "CONTROLROOM_NOTIFICATIONS__WEBHOOKS": json.dumps(
            [{"name": "ops", "url": receiver.url, "secret": SECRET}]
        ),
        "CONTROLROOM_NOTIFICATIONS__DISPATCH_INTERVAL_SECONDS": "0.2",
        "CONTROLROOM_NOTIFICATIONS__SEND_TIMEOUT": "20",
        "CONTROLROOM_NOTIFICATIONS__CLAIM_SECONDS": "21",
    }
