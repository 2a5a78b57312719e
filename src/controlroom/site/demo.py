"""Live site calls for ``make demo``: two local site agents calling flaky HTTP targets.

``run_site_demo`` serves, in one process, a set of HTTP targets and two site agents
(``north`` and ``south``) that keep making cached calls to them and send their telemetry
to central:

- ``/recovers/{call}`` fails twice (503), then accepts: the call is Delivered after two
  Attempted;
- ``/maintenance/{call}`` fails every attempt until the call has Parked, then accepts:
  an operator's Retry (through central) delivers it;
- ``/rejects/{call}`` answers 400: the call is Failed at once.

Each agent also sends a notification through central about every ``NOTIFY_EVERY``
seconds (two agents: a few a minute), in turn to the ``ops-chat`` webhook, the
``oncall`` recipient list and the ``pager`` webhook, which the demo's webhook sink
refuses (``controlroom.demo_notifications``), so the console shows deliveries and a
parked notification to Retry or Discard.

Central must list the agents as sites (``demo_sites`` gives the entries, with each
site's two secrets) to take their telemetry, reconcile them and relay Retry/Discard.
Their ports follow central's (``demo_ports``: 11, 12 and 13 past it, so 8091-8093 beside
8080), so a second demo beside a first on another central port takes other ports too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import SecretStr

from controlroom.runtime.sockets import listen
from controlroom.site.agent import CachedCallFailed, SiteAgent
from controlroom.site.config import SiteSettings
from controlroom.site.service import SiteService, make_server

log = logging.getLogger(__name__)

SITE_NAMES = ("north", "south")
DEFAULT_CENTRAL_PORT = 8080
_PAST_CENTRAL = (11, 12, 13)  # north, south, the targets
MAX_RETRIES = 3
SCENARIOS = ("recovers", "recovers", "maintenance", "rejects")

CHAT_WEBHOOK = "ops-chat"
ONCALL_LIST = "oncall"
PAGER_WEBHOOK = "pager"
"""The names central's demo outbox gives its channels (``controlroom.demo_notifications``
configures them from these); its webhook sink refuses the pager."""
NOTIFY_EVERY = 40.0
"""Seconds between an agent's notifications, on average (each wait is 0.5 to 1.5 times
it): at most three a minute per agent."""
_NOTIFICATIONS = (
    ("Webhook", CHAT_WEBHOOK, "Info", "Shift report of {site} is ready", "Batch {n} closed."),
    ("Email", ONCALL_LIST, "Warning", "Tank level low at {site}", "Reading {n} below 20 %."),
    ("Webhook", PAGER_WEBHOOK, "Error", "Line stopped at {site}", "Stop {n}: motor overload."),
)


def demo_secrets(site: str) -> tuple[str, str]:
    """The demo's secrets of ``site``: the token central presents to its agent, and the
    token its agent presents to central. Fixed and published (the Makefile holds them
    too): the demo listens on loopback only, and a real site needs secrets of its own."""
    return f"demo-{site}-agent-secret", f"demo-{site}-telemetry-secret"


def demo_ports(central_port: int) -> tuple[int, int, int]:
    """The ports of the north agent, the south agent and the targets for a central on
    ``central_port``: 11, 12 and 13 past it (8091-8093 for 8080); 13, 12 and 11 below it
    when that would pass 65535; those of 8080 for a central below 1024 or on port 0 (any
    free one), where ports past it would need privileges."""
    if central_port < 1024:
        central_port = DEFAULT_CENTRAL_PORT
    if central_port + max(_PAST_CENTRAL) <= 65535:
        north, south, targets = (central_port + offset for offset in _PAST_CENTRAL)
    else:
        north, south, targets = (central_port - offset for offset in reversed(_PAST_CENTRAL))
    return north, south, targets


def central_port_of(central_url: str) -> int:
    """The port of ``central_url`` (80 or 443 by its scheme when it names none)."""
    parts = urlsplit(central_url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def demo_sites(
    host: str = "127.0.0.1", *, central_port: int = DEFAULT_CENTRAL_PORT
) -> list[dict[str, str]]:
    """The ``sites`` entries central on ``central_port`` needs for the demo agents."""
    entries = []
    for site, port in zip(SITE_NAMES, demo_ports(central_port)[:2], strict=True):
        token, central_token = demo_secrets(site)
        entries.append(
            {
                "id": site,
                "base_url": f"http://{host}:{port}",
                "token": token,
                "central_token": central_token,
            }
        )
    return entries


def flaky_targets() -> FastAPI:
    """The demo's HTTP targets (module doc); attempts are counted per call."""
    attempts: Counter[str] = Counter()
    app = FastAPI(title="Controlroom demo targets")

    @app.post("/{behaviour}/{call}")
    def target(behaviour: str, call: str) -> JSONResponse:
        attempts[call] += 1
        if behaviour == "rejects":
            return JSONResponse({"error": "the order number is malformed"}, 400)
        failing = 2 if behaviour == "recovers" else MAX_RETRIES
        if attempts[call] <= failing:
            return JSONResponse({"error": "the upstream service is unavailable"}, 503)
        return JSONResponse({"accepted": call})

    return app


def demo_notification(site: str, n: int) -> dict[str, str]:
    """The ``n``-th notification (from 0) an agent of ``site`` sends: ``SiteAgent.notify``'s
    arguments, the three kinds in turn (module docstring)."""
    channel, target, severity, subject, body = _NOTIFICATIONS[n % len(_NOTIFICATIONS)]
    return {
        "channel": channel,
        "target": target,
        "severity": severity,
        "subject": subject.format(site=site),
        "body": body.format(n=n + 1),
    }


async def send_notifications(agent: SiteAgent, site: str, every: float, rng: random.Random) -> None:
    """Until cancelled: wait about ``every`` seconds, send the next ``demo_notification``
    (stored at the agent, forwarded to central by its outbox)."""
    n = 0
    while True:
        await asyncio.sleep(every * rng.uniform(0.5, 1.5))
        notification = demo_notification(site, n)
        target = notification.pop("target")
        subject = notification.pop("subject")
        await asyncio.to_thread(agent.notify, target, subject, **notification)
        n += 1


async def _make_calls(agent: SiteAgent, targets_url: str, every: float, rng: random.Random) -> None:
    while True:
        behaviour = rng.choice(SCENARIOS)
        url = f"{targets_url}/{behaviour}/{uuid.uuid4()}"
        with contextlib.suppress(CachedCallFailed):
            await asyncio.to_thread(agent.http_call, "POST", url, json={"demo": True})
        await asyncio.sleep(every * rng.uniform(0.5, 1.5))


def demo_store_path(data_dir: Path, site: str) -> Path:
    """Where the demo's agent ``site`` keeps its tracking store: under ``data_dir``, the
    data directory of the demo's central, so that a demo given its own data directory
    shares nothing with another one (README "Quick start")."""
    return data_dir / "sites" / site / "tracking.db"


async def run_site_demo(
    data_dir: Path,
    central_url: str,
    *,
    every: float = 3.0,
    notify_every: float = NOTIFY_EVERY,
    ports: tuple[int, int, int] | None = None,
) -> None:
    """Serve the targets and the two agents, making a call per agent about every
    ``every`` seconds and sending a notification per agent about every ``notify_every``
    seconds, until cancelled. ``ports`` (north, south, targets): by default
    ``demo_ports`` of ``central_url``'s port. Raises ``ConfigurationError`` naming the
    address when a port is taken."""
    north, south, targets_port = ports or demo_ports(central_port_of(central_url))
    taken_hint = (
        "CONTROLROOM_PORT for central, 16 or more away from a running demo's (a demo takes "
        "the ports 11-15 past its own)"
    )
    listeners = [listen("127.0.0.1", targets_port, chosen_by=taken_hint)]
    targets_url = f"http://127.0.0.1:{targets_port}"
    targets = make_server(flaky_targets())
    tasks = [asyncio.create_task(targets.serve(sockets=listeners[:1]))]
    agents = []
    rng = random.Random()
    try:
        for site, port in zip(SITE_NAMES, (north, south), strict=True):
            listener = listen("127.0.0.1", port, chosen_by=taken_hint)
            listeners.append(listener)
            token, central_token = demo_secrets(site)
            agent = SiteAgent(
                SiteSettings(
                    site_id=site,
                    node=f"{site}-1",
                    store_path=demo_store_path(data_dir, site),
                    port=port,
                    token=SecretStr(token),
                    central_url=central_url,
                    central_token=SecretStr(central_token),
                    max_retries=MAX_RETRIES,
                    backoff_base=2.0,
                    backoff_cap=10.0,
                )
            )
            agents.append(agent)
            tasks.append(asyncio.create_task(SiteService(agent).run(listener)))
            tasks.append(asyncio.create_task(_make_calls(agent, targets_url, every, rng)))
            tasks.append(asyncio.create_task(send_notifications(agent, site, notify_every, rng)))
        await asyncio.gather(*tasks)
    finally:
        targets.should_exit = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for agent in agents:
            agent.close()
        for listener in listeners:
            listener.close()
