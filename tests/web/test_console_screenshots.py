"""Screenshots of each console page at a desktop (1280x800) and a phone (390x844) size,
over the demo's failed messages.

The test checks each page renders at both sizes (its heading, no request off 127.0.0.1,
no dialog); it asserts nothing about pixels. The images go to a scratch directory, or,
with ``CONTROLROOM_UPDATE_SCREENSHOTS=1``, to ``docs/screenshots/`` (shown in the README),
so an ordinary test run leaves the repository as it was.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from controlroom.db.tables import failed_messages
from controlroom.demo import generate_demo_messages
from controlroom.errors.ingest.parsing import parse_failed_message
from tests.retries.conftest import TIMEOUT
from tests.web.conftest import ConsoleServer

expect.set_options(timeout=TIMEOUT * 1000)

DOCS_SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
UPDATE = os.environ.get("CONTROLROOM_UPDATE_SCREENSHOTS") == "1"
SIZES = {"desktop": (1280, 800), "phone": (390, 844)}


@pytest.fixture
def database_url(tmp_path: Path) -> Iterator[str]:
    """Screenshots are taken once, on SQLite."""
    yield f"sqlite:///{tmp_path / 'controlroom.db'}"


def test_screenshots_of_every_console_page(
    console_server: ConsoleServer, browser_context: Any, tmp_path: Path
) -> None:
    screenshots = DOCS_SCREENSHOTS if UPDATE else tmp_path
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
