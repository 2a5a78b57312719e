"""Screenshots of each console page at a desktop (1280x800) and a phone (390x844) size,
over the demo's failed messages and site calls (with a day of KPI history).

The test checks each page renders at both sizes (its heading, no request off 127.0.0.1,
no dialog); it asserts nothing about pixels. The images go to a scratch directory, or,
with ``CONTROLROOM_UPDATE_SCREENSHOTS=1``, to ``docs/screenshots/`` (shown in the README),
so an ordinary test run leaves the repository as it was.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from controlroom.config import ConfiguredSite, Settings
from controlroom.db.tables import failed_messages, site_calls
from controlroom.demo import generate_demo_messages
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.sitecalls.demo import SITES, generate_demo_telemetry
from controlroom.sitecalls.history import take_sample
from tests.retries.conftest import TIMEOUT
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.web.conftest import ConsoleServer, ServerFactory

expect.set_options(timeout=TIMEOUT * 1000)

DOCS_SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
UPDATE = os.environ.get("CONTROLROOM_UPDATE_SCREENSHOTS") == "1"
SIZES = {"desktop": (1280, 800), "phone": (390, 844)}


@pytest.fixture
def database_url(tmp_path: Path) -> Iterator[str]:
    """Screenshots are taken once, on SQLite."""
    yield f"sqlite:///{tmp_path / 'controlroom.db'}"


def seed_site_calls(server: ConsoleServer, now: datetime) -> str:
    """The demo's site-call telemetry, one rejected packet, and a day of KPI history
    (sampled every ten minutes as the sampler would have); returns a Parked call's id."""
    packets = generate_demo_telemetry(seed=12, now=now)
    rejected = {**packets[0], "status": "Lost", "tracked_operation_id": "not-a-guid"}
    answer = httpx.post(
        f"{server.base_url}/api/site-calls/telemetry",
        json=[*packets, rejected],
        timeout=TEST_CLIENT_TIMEOUT,
    )
    assert answer.status_code == 200, answer.text
    for minutes in range(0, 24 * 60, 10):
        take_sample(server.engine, server.settings, now - timedelta(minutes=minutes))
    with server.engine.connect() as conn:
        return str(
            conn.execute(
                sa.select(site_calls.c.tracked_operation_id)
                .where(site_calls.c.status == "Parked")
                .order_by(site_calls.c.tracked_operation_id)
                .limit(1)
            ).scalar_one()
        )


def test_screenshots_of_every_console_page(
    start_console: ServerFactory, settings: Settings, browser_context: Any, tmp_path: Path
) -> None:
    screenshots = DOCS_SCREENSHOTS if UPDATE else tmp_path
    # The demo's sites, configured at an address where no agent answers.
    sites = [ConfiguredSite(id=site, base_url="http://127.0.0.1:9") for site in SITES]
    console_server = start_console(settings.model_copy(update={"sites": sites}))
    parked_call = seed_site_calls(console_server, datetime.now(UTC))
    messages = generate_demo_messages(40, seed=12, now=datetime(2026, 12, 1, 9, 30, tzinfo=UTC))
    for message in messages:
        console_server.publish(message.headers, message.body)
    # One row per distinct message (repeated failures fold), less the one failed import.
    expected = {
        parse_failed_message(
            message.headers, message.body, max_body_size_to_store=0
        ).unique_message_id
        for message in messages
        if message.headers.get("NServiceBus.FailedQ")
    }
    console_server.wait_until_stored(len(expected))
    with console_server.engine.connect() as conn:
        json_message = conn.execute(
            sa.select(failed_messages.c.id)
            .where(failed_messages.c.content_type.like("%json%"))
            .order_by(failed_messages.c.last_failure_at.desc())
            .limit(1)
        ).scalar_one()
    pages = {
        "dashboard": "/",
        "failed-messages": "/messages",
        "failed-message": f"/messages/{json_message}",
        "groups": "/groups",
        "endpoints": "/endpoints",
        "site-calls": "/site-calls",
        "site-call": f"/site-calls/{parked_call}",
        "rejected-telemetry": "/site-calls/rejected",
        "sites": "/sites",
        "audit-log": "/audit-log",
        "failed-imports": "/failed-imports",
        "event-log": "/event-log",
        "api-docs": "/docs",
    }
    screenshots.mkdir(parents=True, exist_ok=True)
    page = browser_context.new_page()
    for size, (width, height) in SIZES.items():
        page.set_viewport_size({"width": width, "height": height})
        for name, path in pages.items():
            page.goto(console_server.base_url + path)
            if name == "api-docs":
                expect(page.locator(".swagger-ui .info .title")).to_be_visible()
            else:
                expect(page.locator("main h1")).to_be_visible()
            if name == "failed-message":
                expect(page.get_by_test_id("body")).to_be_visible()
            target = screenshots / f"{name}-{width}x{height}.png"
            page.screenshot(path=str(target))
            assert target.stat().st_size > 0, f"{size} screenshot of {name} is empty"
