"""The site demo's targets behave as `make demo` promises; its servers answer without
waiting for a delayed ACK."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from controlroom.site import demo
from controlroom.site.demo import MAX_RETRIES, demo_sites, flaky_targets
from tests.nodelay import accepted_with_nodelay

CONTROLROOM_EXE = Path(sys.executable).parent / "controlroom"


def test_the_demo_targets() -> None:
    client = TestClient(flaky_targets())
    assert [client.post("/recovers/a").status_code for _ in range(3)] == [503, 503, 200]
    parks = [client.post("/maintenance/b").status_code for _ in range(MAX_RETRIES + 1)]
    assert parks == [503] * MAX_RETRIES + [200]  # parked first, then an operator's retry
    assert client.post("/rejects/c").status_code == 400


def test_the_demo_sites_entries_are_valid_central_settings() -> None:
    from controlroom.config import Settings

    assert [site.id for site in Settings(sites=demo_sites()).sites] == ["north", "south"]


def test_every_connection_the_demo_accepts_has_tcp_nodelay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Free ports (probed, as for a child process) instead of those past central's.
    targets, north, south, central = (free_port() for _ in range(4))

    async def main() -> list[bool]:
        running = asyncio.create_task(
            demo.run_site_demo(
                tmp_path,
                f"http://127.0.0.1:{central}",
                every=60.0,
                ports=(north, south, targets),
            )
        )
        try:
            async with asyncio.timeout(60):
                for port in (targets, north, south):
                    while not await asyncio.to_thread(_accepts, port):
                        await asyncio.sleep(0.05)
                return [
                    await asyncio.to_thread(accepted_with_nodelay, "127.0.0.1", port)
                    for port in (targets, north, south)
                ]
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running

    assert asyncio.run(main()) == [True, True, True]


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_make_demo_configures_central_with_the_demo_agents_secrets() -> None:
    """`make demo` (`controlroom demo run`) gives serve the sites `controlroom site demo`
    runs, secrets included: otherwise central refuses the agents' telemetry and the agents
    central's pulls."""
    import json

    from controlroom.cli import demo_central_environment

    given = demo_central_environment(8080)
    assert json.loads(given["CONTROLROOM_SITES"]) == demo_sites(central_port=8080)
    assert all(site["token"] and site["central_token"] for site in demo_sites())
    assert json.loads(given["CONTROLROOM_NOTIFICATIONS"])["webhooks"]


def test_the_demo_serve_reconciles_first_once_its_site_agents_are_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`make demo` starts serve before the site agents: its first reconciliation pass
    waits for them rather than warning that every site is unreachable."""
    from controlroom.cli import demo_central_environment
    from controlroom.config import Settings

    for name, value in demo_central_environment(8080).items():
        monkeypatch.setenv(name, value)
    assert Settings().reconciliation.first_pass_delay.total_seconds() >= 5


def test_each_demo_agent_sends_a_few_notifications_a_minute_some_to_the_refused_pager() -> None:
    from controlroom.config import NotificationSettings
    from controlroom.demo_notifications import REFUSED_WEBHOOK, demo_notification_settings

    outbox = NotificationSettings.model_validate(demo_notification_settings(8080))
    sent = [demo.demo_notification("north", n) for n in range(6)]
    for notification in sent:  # every target is one of central's demo channels
        if notification["channel"] == "Webhook":
            assert outbox.webhook(notification["target"]) is not None
        else:
            assert outbox.recipients(notification["target"]) is not None
    assert sum(n["target"] == REFUSED_WEBHOOK for n in sent) == 2  # the parked flow
    assert len({n["target"] for n in sent}) == 3
    shortest_wait = demo.NOTIFY_EVERY * 0.5
    assert 60 / shortest_wait <= 3  # at most three a minute per agent


def test_the_demo_agents_notifications_are_stored_for_central(tmp_path: Path) -> None:
    from controlroom.site import SiteAgent, SiteSettings

    agent = SiteAgent(
        SiteSettings(
            site_id="north",
            store_path=tmp_path / "tracking.db",
            token="demo-north-agent-secret",
        )
    )

    async def three() -> None:
        sending = asyncio.create_task(
            demo.send_notifications(agent, "north", 0.0, random.Random(1))
        )
        try:
            async with asyncio.timeout(30):
                while len(await asyncio.to_thread(agent.store.notifications, None, 10)) < 3:
                    await asyncio.sleep(0.01)
        finally:
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending

    try:
        asyncio.run(three())
        stored = agent.store.notifications(None, 10)
    finally:
        agent.close()
    assert {row["target"] for row in stored} >= {"ops-chat", "oncall", "pager"}
    assert all(row["status"] == "Pending" for row in stored)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a shell's `&` leaves a job


def test_the_site_demo_stops_on_sigint_even_when_started_with_it_ignored(
    tmp_path: Path,
) -> None:
    """Fresh-user pass (second): ``controlroom site demo &`` from a script could not be
    stopped with SIGINT (the shell leaves it ignored; serve and the other demos route
    it themselves)."""
    central = free_port()
    log = tmp_path / "demo.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [str(CONTROLROOM_EXE), "site", "demo", "--central-url", f"http://127.0.0.1:{central}"],
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "CONTROLROOM_DATA_DIR": str(tmp_path / "data")},
            preexec_fn=_ignore_sigint,
        )
        try:
            # Its targets answer once its loop runs, and routes the signals.
            targets = central + 13
            deadline = time.monotonic() + 60
            while not _accepts(targets) and time.monotonic() < deadline:
                assert process.poll() is None, log.read_text()
                time.sleep(0.1)
            process.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
            stopped = process.poll() is not None
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert stopped, f"SIGINT did not stop the site demo: {log.read_text()}"
    assert process.returncode == 0, log.read_text()
