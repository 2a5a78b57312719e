"""Partial-word search and the groups' trends, clicked in Chromium, on every provider:
the console widens a search that found no whole word and says so, says why nothing
matched, and draws each group's failures per hour (inline SVG under the page's CSP)
with a sort by growth. See ``conftest.py`` for the fence every page runs in."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from playwright.sync_api import expect

from tests.nsb import failed_headers
from tests.retries.conftest import TIMEOUT
from tests.web.conftest import ConsoleServer

expect.set_options(timeout=TIMEOUT * 1000)


def test_a_partial_word_is_found_and_the_page_says_how(
    console_server: ConsoleServer, page: Any
) -> None:
    now = datetime.now(UTC)
    for n in range(3):
        headers = failed_headers(f"order-{n}", failed_at=now - timedelta(hours=n))
        console_server.publish(headers, b'{"sku": "kumquat"}')
    console_server.wait_until_stored(3)

    page.goto(console_server.base_url + "/messages?status=")
    page.get_by_label("Search").fill("InvalidOperation")
    page.get_by_role("button", name="Apply").click()
    expect(page.get_by_test_id("total")).to_have_text("3 messages")
    expect(page.get_by_test_id("search-note")).to_contain_text(
        "No message contains “invalidoperation” as a whole word"
    )

    page.get_by_label("Search").fill("zebra")
    page.get_by_role("button", name="Apply").click()
    expect(page.get_by_test_id("total")).to_have_text("0 messages")
    expect(page.get_by_test_id("search-note")).to_contain_text(
        "no message contains a word starting with “zebra”"
    )

    page.goto(console_server.base_url + "/groups")
    expect(page.locator("svg.sparkline")).to_have_count(1)
    expect(page.locator("svg.sparkline rect")).to_have_count(3)  # one bar per hour with failures
    expect(page.get_by_test_id("group-growth")).to_have_text(re.compile(r"^\+3 "))
    page.get_by_role("link", name=re.compile("growth")).click()
    expect(page).to_have_url(re.compile(r"sort=growth"))
    expect(page.locator("svg.sparkline")).to_have_count(1)
