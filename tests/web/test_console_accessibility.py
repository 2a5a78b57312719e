"""docs/decisions.md "Every console page passes axe-core": axe-core (the copy the
``axe-playwright-python`` package bundles, offline) over every console page with the
demo's failed messages and site calls, at a desktop and a phone size, finds no serious
or critical violation; focus is visible and the actions answer the keyboard.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from controlroom.config import ConfiguredSite, Settings
from controlroom.db.tables import failed_messages
from controlroom.demo import generate_demo_messages
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.sitecalls.demo import SITES
from tests.nsb import failed_headers
from tests.python_tasks import celery_failure
from tests.retries.conftest import TIMEOUT
from tests.web.conftest import ConsoleServer, ServerFactory
from tests.web.test_console_screenshots import SIZES, seed_site_calls

axe_playwright = pytest.importorskip(
    "axe_playwright_python.sync_playwright", reason="axe-playwright-python is not installed"
)
expect.set_options(timeout=TIMEOUT * 1000)

BLOCKING = ("serious", "critical")


@pytest.fixture
def database_url(tmp_path: Path) -> Iterator[str]:
    """Checked once, on SQLite (the pages do not differ by provider)."""
    yield f"sqlite:///{tmp_path / 'controlroom.db'}"


@pytest.fixture
def demo_console(start_console: ServerFactory, settings: Settings) -> ConsoleServer:
    """The process with the demo's data: failed messages, site calls, a day of KPIs."""
    sites = [ConfiguredSite(id=site, base_url="http://127.0.0.1:9") for site in SITES]
    server = start_console(settings.model_copy(update={"sites": sites}))
    messages = generate_demo_messages(40, seed=12, now=datetime(2026, 12, 1, 9, 30, tzinfo=UTC))
    published = [(message.headers, message.body) for message in messages]
    published.append(celery_failure("python-task-1"))  # a Python task's page too
    for headers, body in published:
        server.publish(headers, body)
    stored = {
        parse_failed_message(headers, body, max_body_size_to_store=0).unique_message_id
        for headers, body in published
        if headers.get("NServiceBus.FailedQ")
    }
    server.wait_until_stored(len(stored))
    return server


def console_pages(server: ConsoleServer, parked_call: str) -> dict[str, str]:
    """Every console page (the API's Swagger UI is a vendored page, not the console's)."""
    with server.engine.connect() as conn:
        message = conn.execute(
            sa.select(failed_messages.c.id)
            .where(failed_messages.c.content_type.like("%json%"))
            .order_by(failed_messages.c.last_failure_at.desc())
            .limit(1)
        ).scalar_one()
        group_query = "/messages?status=unresolved"
        python_task = conn.execute(
            sa.select(failed_messages.c.id).where(failed_messages.c.message_id == "python-task-1")
        ).scalar_one()
    return {
        "dashboard": "/",
        "failed-messages": "/messages",
        "failed-messages-searched": "/messages?q=nothing-matches-this",
        "group-messages": group_query,
        "failed-message": f"/messages/{message}",
        "python-task": f"/messages/{python_task}",
        "edit": f"/messages/{message}/edit",
        "groups": "/groups",
        "endpoints": "/endpoints",
        "site-calls": "/site-calls",
        "site-call": f"/site-calls/{parked_call}",
        "rejected-telemetry": "/site-calls/rejected",
        "sites": "/sites",
        "audit-log": "/audit-log",
        "notifications": "/notifications",
        "failed-imports": "/failed-imports",
        "event-log": "/event-log",
        "sign-in": "/signin",
        "not-found": "/no-such-page",
    }


def blocking_violations(page: Any) -> list[str]:
    """axe-core's serious and critical violations on ``page``, one line each."""
    results = axe_playwright.Axe().run(page)
    return [
        f"{violation['id']} ({violation['impact']}): {violation['help']} at "
        + ", ".join(str(node["target"]) for node in violation["nodes"][:3])
        for violation in results.response["violations"]
        if violation["impact"] in BLOCKING
    ]


def test_every_console_page_passes_axe_core(demo_console: ConsoleServer, chromium: Any) -> None:
    parked_call = seed_site_calls(demo_console, datetime.now(UTC))
    pages = console_pages(demo_console, parked_call)
    # The page's CSP forbids the test's injected axe-core, not the console's own scripts.
    context = chromium.new_context(bypass_csp=True)
    context.set_default_timeout(TIMEOUT * 1000)
    page = context.new_page()
    found: dict[str, list[str]] = {}
    try:
        for size, (width, height) in SIZES.items():
            page.set_viewport_size({"width": width, "height": height})
            for name, path in pages.items():
                page.goto(demo_console.base_url + path)
                expect(page.locator("main h1")).to_be_visible()
                page.wait_for_load_state("networkidle")
                if violations := blocking_violations(page):
                    found[f"{name} at {size}"] = violations
        page.get_by_text("Menu", exact=True).click()  # the phone's navigation, unfolded
        expect(page.get_by_role("link", name="Sites", exact=True)).to_be_visible()
        if violations := blocking_violations(page):
            found["the open menu at phone"] = violations
    finally:
        context.close()
    assert found == {}, "\n".join(f"{where}: {lines}" for where, lines in found.items())


def test_focus_is_visible_and_a_message_is_retried_from_the_keyboard(
    console_server: ConsoleServer, page: Any
) -> None:
    console_server.publish(failed_headers("keyboard-1"), b"{}")
    console_server.wait_until_stored(1)
    page.goto(console_server.base_url + "/messages")
    link = page.locator("table.messages tbody a").first
    for _ in range(40):
        page.keyboard.press("Tab")
        if link.evaluate("el => el === document.activeElement"):
            break
    style, width = link.evaluate(
        "el => [getComputedStyle(el).outlineStyle, parseFloat(getComputedStyle(el).outlineWidth)]"
    )
    # The console's own ring: solid and at least 2 px (the browser's default is 1 px).
    assert style == "solid" and width >= 2, f"the focused link's outline: {style} {width}px"
    page.keyboard.press("Enter")
    retry = page.get_by_role("button", name="Retry", exact=True)
    expect(retry).to_be_visible()
    retry.focus()
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("status")).to_have_text("RetryIssued")
