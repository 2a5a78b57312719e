"""A site agent killed with SIGKILL mid-retry: on restart it resumes its buffered call and
its outbox delivers what it had not sent; killed with notifications stored while central
was down, it forwards each to central once after the restart (``controlroom site serve``
in a subprocess)."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from controlroom.db.tables import notifications
from tests.reconciliation.harness import (
    SITE_TOKEN,
    audit_events,
    central_rows,
    central_settings,
    central_token_of,
    eventually,
    running_central,
    site_entry,
)
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.site.http import FlakyTargets, serving

AUTH = {"Authorization": f"Bearer {SITE_TOKEN}"}


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


@contextmanager
def site_process(env: dict[str, str]) -> Iterator[subprocess.Popen]:
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("controlroom")), "site", "serve"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(30)
        process.stderr.close()


def store_query(path: Path, sql: str) -> list[tuple]:
    """Read the agent's store beside it (WAL lets a reader in while it writes)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as conn:
        return conn.execute(sql).fetchall()


@pytest.fixture
def central() -> Iterator[socket.socket]:
    """Central's port, held from the start: bound but not listening, so the agent's
    connections are refused (central is down), and no server of a test running beside
    takes the port before central listens on it (a free port closed and bound again
    later can be taken: a full parallel run once waited 60 s for a delivery there)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held


def test_a_killed_agent_resumes_its_buffered_call_and_sends_its_outbox(
    database_url: str, tmp_path: Path, central: socket.socket
) -> None:
    targets = FlakyTargets()
    targets.hold_after["x"] = 5  # the 6th attempt hangs until the agent is killed
    store = tmp_path / "site" / "tracking.db"
    port = free_port()
    central_port = central.getsockname()[1]
    env = {
        "CONTROLROOM_SITE_SITE_ID": "plant-7",
        "CONTROLROOM_SITE_STORE_PATH": str(store),
        "CONTROLROOM_SITE_PORT": str(port),
        "CONTROLROOM_SITE_TOKEN": SITE_TOKEN,
        "CONTROLROOM_SITE_CENTRAL_URL": f"http://127.0.0.1:{central_port}",  # down for now
        "CONTROLROOM_SITE_CENTRAL_TOKEN": central_token_of("plant-7"),
        "CONTROLROOM_SITE_MAX_RETRIES": "10000",
        "CONTROLROOM_SITE_BACKOFF_BASE": "0.02",
        "CONTROLROOM_SITE_BACKOFF_CAP": "0.05",
        "CONTROLROOM_SITE_RETRY_POLL": "0.05",
        "CONTROLROOM_SITE_OUTBOX_POLL": "0.05",
        "CONTROLROOM_SITE_OUTBOX_BACKOFF_CAP": "0.2",
    }
    agent_url = f"http://127.0.0.1:{port}"
    with serving(targets.app) as target_url:
        with site_process(env) as first:
            eventually(lambda: _up(agent_url, first), what="the agent serves")
            answer = httpx.post(
                f"{agent_url}/site/calls",
                json={"url": f"{target_url}/always-503/x"},
                headers=AUTH,
                timeout=TEST_CLIENT_TIMEOUT,
            )
            call_id = answer.json()["tracked_operation_id"]
            assert targets.holding.wait(60), "the agent never made its 6th attempt"
            first.send_signal(signal.SIGKILL)  # in the middle of that attempt
            first.wait(30)
            targets.release.set()
        ((status, retries),) = store_query(
            store,
            f"SELECT status, retry_count FROM tracked_operations "
            f"WHERE tracked_operation_id = '{call_id}'",
        )
        assert (status, retries) == ("Attempted", 5)
        claimed = store_query(store, "SELECT claimed_by FROM tracked_operations")
        assert claimed[0][0] is not None  # it died holding the call
        unsent = store_query(store, "SELECT count(*) FROM telemetry_outbox")[0][0]
        assert unsent >= 5  # central was down: nothing was delivered

        targets.fixed.add("x")
        # The site is configured at central (its telemetry token), its agent not pulled.
        sites = [site_entry("plant-7", "http://127.0.0.1:9")]
        settings = central_settings(database_url, tmp_path / "central", sites)
        central.listen()
        with (
            running_central(settings, central) as (_url, _app, engine),
            site_process(env),
        ):
            eventually(
                lambda: central_rows(engine).get(call_id, {}).get("status") == "Delivered",
                what="the resumed call delivered at central",
            )
            eventually(
                lambda: store_query(store, "SELECT count(*) FROM telemetry_outbox")[0][0] == 0,
                what="the outbox drains",
            )
            actions = [e["action"] for e in audit_events(engine, correlation_id=call_id)]
            assert actions.count("CachedCallSubmitted") == 1  # sent after the restart
            assert actions.count("CachedCallAttempted") >= 4
            assert actions.count("CachedCallDelivered") == 1


def _up(url: str, process: subprocess.Popen) -> bool:
    assert process.poll() is None, process.stderr.read().decode()
    try:
        return (
            httpx.get(
                f"{url}/site/tracking/changes", headers=AUTH, timeout=TEST_CLIENT_TIMEOUT
            ).status_code
            == 200
        )
    except httpx.HTTPError:
        return False


def test_notifications_survive_a_kill_and_a_central_outage_and_reach_central_once(
    database_url: str, tmp_path: Path, central: socket.socket
) -> None:
    store = tmp_path / "site" / "tracking.db"
    port = free_port()
    env = {
        "CONTROLROOM_SITE_SITE_ID": "plant-7",
        "CONTROLROOM_SITE_STORE_PATH": str(store),
        "CONTROLROOM_SITE_PORT": str(port),
        "CONTROLROOM_SITE_TOKEN": SITE_TOKEN,
        "CONTROLROOM_SITE_CENTRAL_URL": f"http://127.0.0.1:{central.getsockname()[1]}",
        "CONTROLROOM_SITE_CENTRAL_TOKEN": central_token_of("plant-7"),
        "CONTROLROOM_SITE_OUTBOX_POLL": "0.05",
        "CONTROLROOM_SITE_OUTBOX_BACKOFF_CAP": "0.2",
    }
    agent_url = f"http://127.0.0.1:{port}"
    with site_process(env) as first:
        eventually(lambda: _up(agent_url, first), what="the agent serves")
        ids = [
            httpx.post(
                f"{agent_url}/site/notifications",
                json={"target": "oncall", "subject": f"Pump {n} stopped", "severity": "Error"},
                headers=AUTH,
                timeout=TEST_CLIENT_TIMEOUT,
            ).json()["notification_id"]
            for n in range(3)
        ]
        first.send_signal(signal.SIGKILL)  # central is down: none was forwarded
        first.wait(30)
    kept = store_query(store, "SELECT notification_id, status FROM site_notifications")
    assert sorted(kept) == sorted((i, "Pending") for i in ids)

    sites = [site_entry("plant-7", "http://127.0.0.1:9")]
    settings = central_settings(database_url, tmp_path / "central", sites)
    central.listen()
    with running_central(settings, central) as (_url, _app, engine), site_process(env):
        eventually(
            lambda: (
                store_query(
                    store, "SELECT count(*) FROM site_notifications WHERE status = 'Forwarded'"
                )[0][0]
                == 3
            ),
            what="the notifications forwarded",
        )
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(notifications.c.notification_id, notifications.c.source)
            ).all()
        assert sorted(rows) == sorted((i, "site:plant-7") for i in ids)
