"""A group after its retry, in Chromium, on every provider: a completed retry of a group
left with no Unresolved message can be dismissed from the groups page (as
``DELETE /api/recoverability/unacknowledgedgroups/{id}`` does), and its outcome says
how many of the messages it sent failed again since and are unresolved, there and in the
event log, never that it finished "successfully".
"""

from __future__ import annotations

from typing import Any

import httpx
from playwright.sync_api import expect

from tests.factories import at
from tests.nsb import failed_headers
from tests.retries.conftest import TIMEOUT, wait_for_sync
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.web.conftest import ConsoleServer

expect.set_options(timeout=TIMEOUT * 1000)


def test_a_retried_group_says_how_many_failed_again_and_can_be_dismissed(
    console_server: ConsoleServer, page: Any
) -> None:
    for n in range(5):
        console_server.publish(failed_headers(f"order-{n}"), b'{"n": %d}' % n)
    console_server.wait_until_stored(5)
    base = console_server.base_url

    page.goto(base + "/groups")
    page.get_by_role("button", name="Retry group").click()
    outcome = page.get_by_test_id("group-retry-outcome")
    expect(outcome).to_have_text("Last retry: 5 sent")
    # Every message is RetryIssued: the group has none Unresolved, and can be dismissed.
    row = page.locator("tr[data-group-id]")
    expect(row.get_by_test_id("group-count")).to_have_count(0)
    expect(row.locator("td.num")).to_have_text("0")
    dismiss = page.get_by_role("button", name="Dismiss")
    expect(dismiss).to_be_visible()
    # It looks like an action, a link's colour (not a greyed-out one), and acts like one.
    color, cursor = dismiss.evaluate(
        "el => [getComputedStyle(el).color, getComputedStyle(el).cursor]"
    )
    link_color = page.evaluate(
        """() => { const a = document.createElement("a"); a.href = "#";
                   document.querySelector("main").append(a);
                   const color = getComputedStyle(a).color; a.remove(); return color; }"""
    )
    assert color == link_color and cursor == "pointer", (color, link_color, cursor)
    assert contrast_on_white(color) >= 4.5, color

    # Two of the five fail again at their endpoint and come back to the error queue.
    for n in (1, 3):
        console_server.publish(failed_headers(f"order-{n}", failed_at=at(3600)), b"{}")
    group_id = row.get_attribute("data-group-id")
    wait_for_sync(lambda: unresolved(console_server, group_id) == 2)

    page.reload()
    expect(outcome).to_have_text("Last retry: 5 sent; 2 failed again since and are unresolved")
    expect(page.get_by_test_id("group-count")).to_have_text("2")
    page.goto(base + "/event-log")
    expect(page.locator("main")).to_contain_text("5 sent; 2 failed again since and are unresolved")
    expect(page.locator("main")).not_to_contain_text("successfully")
    api_items = httpx.get(f"{base}/api/eventlogitems", timeout=TEST_CLIENT_TIMEOUT).json()
    (finished,) = [i for i in api_items if i["event_type"] == "RetryOperationCompleted"]
    assert finished["description"].endswith(
        "finished: 5 sent; 2 failed again since and are unresolved"
    )

    page.goto(base + "/groups")
    page.get_by_role("button", name="Dismiss").click()
    expect(page.get_by_role("status").filter(has_text="last retry was dismissed")).to_be_visible()
    expect(outcome).to_have_count(0)
    expect(page.get_by_test_id("group-count")).to_have_text("2")


def contrast_on_white(css_color: str) -> float:
    """The WCAG contrast ratio of an ``rgb(r, g, b)`` colour on white."""
    channels = [int(c) / 255 for c in css_color[css_color.index("(") + 1 : -1].split(",")[:3]]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return 1.05 / (luminance + 0.05)


def unresolved(server: ConsoleServer, group_id: str | None) -> int:
    """The group's Unresolved messages, as the API counts them."""
    answer = httpx.get(
        f"{server.base_url}/api/recoverability/groups/id/{group_id}", timeout=TEST_CLIENT_TIMEOUT
    )
    assert answer.status_code == 200, answer.text
    return int(answer.json()["count"])
