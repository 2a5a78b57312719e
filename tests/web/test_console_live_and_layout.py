"""The console in Chromium as an operator uses it all day: figures that refresh by
themselves (and not while the tab is hidden), headers and stack traces that stay
readable at a desktop and a phone size, failure group titles with room at a desktop
width, the navigation behind a menu button on a phone,
and the edit page of a body too large to edit in a browser.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import expect

from controlroom.sitecalls.demo import generate_demo_telemetry
from controlroom.web.bodies import MAX_SHOWN_BYTES
from tests.notifications.test_api import put
from tests.nsb import failed_headers
from tests.retries.conftest import TIMEOUT
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.web.conftest import ConsoleServer
from tests.web.test_console_sitecalls import packet, post_telemetry

expect.set_options(timeout=TIMEOUT * 1000)

SIZES = {"desktop": (1280, 800), "phone": (390, 844)}
LIVE_PATH = "/live/"


def hide(page: Any, hidden: bool) -> None:
    """The tab hidden (or shown again), as the browser reports it to the page."""
    page.evaluate(
        """hidden => {
            Object.defineProperty(document, "visibilityState",
                {configurable: true, get: () => hidden ? "hidden" : "visible"});
            Object.defineProperty(document, "hidden", {configurable: true, get: () => hidden});
            document.dispatchEvent(new Event("visibilitychange"));
        }""",
        hidden,
    )


# --- live figures ---------------------------------------------------------------------------
def test_the_dashboard_counts_and_kpi_tiles_change_without_a_reload(
    console_server: ConsoleServer, page: Any
) -> None:
    console_server.publish(failed_headers("live-1"), b"{}")
    console_server.wait_until_stored(1)
    page.goto(console_server.base_url + "/")
    loads: list[str] = []
    page.on("load", lambda _: loads.append(page.url))
    expect(page.locator("#tile-unresolved")).to_have_text("1")
    expect(page.get_by_test_id("kpi-buffered").locator(".figure")).to_have_text("0")

    console_server.publish(failed_headers("live-2"), b"{}")
    packets = generate_demo_telemetry(seed=3, now=datetime.now(UTC))
    answer = httpx.post(
        console_server.base_url + "/api/site-calls/telemetry",
        json=packets,
        timeout=TEST_CLIENT_TIMEOUT,
    )
    assert answer.status_code == 200, answer.text

    expect(page.locator("#tile-unresolved")).to_have_text("2")
    expect(page.get_by_test_id("kpi-buffered").locator(".figure")).not_to_have_text("0")
    assert loads == [], "the page was loaded again"


def test_a_hidden_tab_sends_no_poll_and_catches_up_when_shown(
    console_server: ConsoleServer, page: Any
) -> None:
    page.goto(console_server.base_url + "/")
    polls: list[str] = []
    # Polls are fetches; the browser may ask for the favicon whenever it likes.
    page.on(
        "request",
        lambda request: (
            polls.append(request.url) if request.resource_type in ("fetch", "xhr") else None
        ),
    )
    hide(page, True)
    polls.clear()
    # The page's poll came round (and held back) twice while hidden: no request left it.
    expect(page.locator("html")).to_have_attribute(
        "data-polls-held-back", re.compile(r"^([2-9]|\d\d+)$")
    )
    assert polls == []

    console_server.publish(failed_headers("while-hidden"), b"{}")
    console_server.wait_until_stored(1)
    hide(page, False)
    expect(page.locator("#tile-unresolved")).to_have_text("1")
    assert any(LIVE_PATH in url for url in polls)


# --- headers and stack traces -------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_header_names_stay_on_one_line_and_nothing_overflows_the_page(
    console_server: ConsoleServer, page: Any, size: str
) -> None:
    long_line = "   at " + ".".join(f"Shop.Module{n}" for n in range(60)) + "()"
    headers = {
        **failed_headers("wide-1", stack_trace="System.Exception: boom\n" + long_line),
        "Shop.Trace": "x" * 3000,
        "Shop.Words": " ".join(["lorem ipsum dolor"] * 200),
    }
    console_server.publish(headers, b"{}")
    console_server.wait_until_stored(1)
    width, height = SIZES[size]
    page.set_viewport_size({"width": width, "height": height})
    page.goto(console_server.base_url + "/messages")
    # Measured once the page has loaded: before its stylesheet arrives, nothing wraps.
    with page.expect_navigation(wait_until="load"):
        page.locator("table.messages tbody a").first.click()
    expect(page.get_by_test_id("stack-trace")).to_be_visible()

    for name in ("NServiceBus.ProcessingEndpoint", "NServiceBus.ExceptionInfo.StackTrace"):
        lines = page.get_by_text(name, exact=True).evaluate(
            """el => { const range = document.createRange(); range.selectNodeContents(el);
                       return range.getClientRects().length; }"""
        )
        assert lines == 1, f"{name} breaks over {lines} lines at {size}"
    overflow = page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px at {size}"
    trace = page.get_by_test_id("stack-trace")
    box = trace.evaluate(
        """el => { const own = el.getBoundingClientRect();
                   const card = el.closest("section").getBoundingClientRect();
                   return {inside: own.right <= card.right + 0.5 && own.left >= card.left - 0.5,
                           hidden: el.scrollWidth - el.clientWidth,
                           scrolls: getComputedStyle(el).overflowX}; }"""
    )
    assert box["inside"], f"the stack trace leaves its box at {size}"
    assert box["hidden"] <= 0 or box["scrolls"] in ("auto", "scroll"), box


# --- failure groups -----------------------------------------------------------------------
GROUP_TITLE_WORDS = """el => {
    const words = [];
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        for (const found of node.data.matchAll(/\\S+/g)) {
            const range = document.createRange();
            range.setStart(node, found.index);
            range.setEnd(node, found.index + found[0].length);
            const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
            words.push([found[0], lines.size]);
        }
    }
    return words;
}"""


def test_at_a_desktop_width_the_group_column_has_room_and_no_title_word_is_split(
    console_server: ConsoleServer, page: Any
) -> None:
    failures = [
        ("System.InvalidOperationException", "Shop.Sales.PlaceOrderHandler.Handle"),
        ("Shop.Payments.CardDeclinedException", "Shop.Payments.ChargeCardHandler.Handle"),
        ("System.Data.SqlClient.SqlException", "Shop.Shipping.ReserveStockHandler.Handle"),
    ]
    for n, (exception_type, frame) in enumerate(failures):
        trace = f"{exception_type}: boom\n   at {frame}(Command message, IMessageHandlerContext c)"
        console_server.publish(
            failed_headers(f"group-{n}", exception_type=exception_type, stack_trace=trace), b"{}"
        )
    console_server.wait_until_stored(len(failures))
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(console_server.base_url + "/groups")
    titles = page.locator("table.groups tbody td:first-child > a")
    expect(titles).to_have_count(len(failures))

    table = page.locator("table.groups").bounding_box()
    assert table is not None
    for index in range(titles.count()):
        title = titles.nth(index)
        cell = title.locator("xpath=..").bounding_box()
        assert cell is not None
        assert cell["width"] >= table["width"] / 3, (
            f"the Group column is {cell['width']:.0f}px of {table['width']:.0f}px"
        )
        split = [word for word, lines in title.evaluate(GROUP_TITLE_WORDS) if lines > 1]
        assert split == [], f"words broken across lines: {split}"
    overflow = page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px"


def page_overflow(page: Any) -> int:
    """How far the page scrolls sideways, in CSS pixels (0 when it does not)."""
    return int(
        page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    )


@pytest.mark.parametrize("size", SIZES)
def test_a_notification_with_a_long_unbroken_body_line_does_not_widen_the_page(
    console_server: ConsoleServer, page: Any, size: str
) -> None:
    notification_id = put(
        console_server.engine, body="token=" + "A" * 400 + "\nsecond line", subject="S" * 250
    )
    width, height = SIZES[size]
    page.set_viewport_size({"width": width, "height": height})
    page.goto(f"{console_server.base_url}/notifications/{notification_id}", wait_until="load")
    expect(page.get_by_test_id("body")).to_contain_text("second line")
    assert page_overflow(page) <= 0, f"the page scrolls sideways by {page_overflow(page)}px"


@pytest.mark.parametrize("size", SIZES)
def test_a_site_calls_audit_table_keeps_short_tokens_whole_and_nothing_overflows(
    console_server: ConsoleServer, page: Any, size: str
) -> None:
    now = datetime.now(UTC)
    target = "https://erp.example.com/api/" + "orders" * 36
    details = '{"payload": "' + "x" * 400 + '", "note": "' + "words " * 60 + '"}'
    call = packet(
        "Parked",
        created=now - timedelta(minutes=5),
        site="north",
        target=target,
        last_error="E" * 500,
        event={
            "actor": "site:north",
            "action": "CachedCallSubmitted",
            "target": target,
            "details_json": details,
        },
    )
    post_telemetry(console_server, [call])
    width, height = SIZES[size]
    page.set_viewport_size({"width": width, "height": height})
    page.goto(
        f"{console_server.base_url}/site-calls/{call['tracked_operation_id']}", wait_until="load"
    )
    expect(page.locator("table")).to_contain_text("CachedCallSubmitted")
    if size == "desktop":
        for token in ("site:north", "CachedCallSubmitted", "Success", "CachedCall"):
            lines = page.locator("td", has_text=re.compile(f"^{token}$")).evaluate(
                """el => { const range = document.createRange(); range.selectNodeContents(el);
                           return range.getClientRects().length; }"""
            )
            assert lines == 1, f"{token} breaks over {lines} lines"
    assert page_overflow(page) <= 0, f"the page scrolls sideways by {page_overflow(page)}px"
    table = page.locator(".table-scroll").evaluate("el => el.scrollWidth - el.clientWidth")
    assert table <= 0, f"the audit table scrolls sideways by {table}px"


# Where each line of an element's text ends: the character before each break, found by
# the top of each character's box changing (a character per line means per-character wrap).
LINE_ENDS_JS = """el => {
    const text = el.textContent, range = document.createRange(), walker =
        document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    const tops = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode())
        for (let i = 0; i < node.length; i++) {
            range.setStart(node, i); range.setEnd(node, i + 1);
            const box = range.getBoundingClientRect();
            if (box.width > 0) tops.push([node.data[i], Math.round(box.top)]);
        }
    const ends = [];
    for (let i = 1; i < tops.length; i++)
        if (tops[i][1] > tops[i - 1][1]) ends.push(tops[i - 1][0]);
    return ends;
}"""


@pytest.mark.parametrize("size", SIZES)
def test_the_audit_logs_target_wraps_at_punctuation_not_per_character(
    console_server: ConsoleServer, page: Any, size: str
) -> None:
    now = datetime.now(UTC)
    target = "https://erp.example.com/api/v2/customers/4711/orders/2026-12-04-000815/lines?expand=all&page=2"
    details = '{"note": "' + "words " * 80 + '", "payload": "' + "x" * 300 + '"}'
    call = packet(
        "Parked",
        created=now - timedelta(minutes=5),
        site="north",
        target=target,
        event={
            "actor": "site:north",
            "action": "CachedCallSubmitted",
            "target": target,
            "details_json": details,
        },
    )
    post_telemetry(console_server, [call])
    width, height = SIZES[size]
    page.set_viewport_size({"width": width, "height": height})
    page.goto(f"{console_server.base_url}/audit-log", wait_until="load")
    cell = page.locator('td[data-label="Target"]', has_text="customers")
    expect(cell).to_be_visible()
    ends = cell.evaluate(LINE_ENDS_JS)
    assert len(ends) <= (3 if size == "desktop" else 2), f"{len(ends) + 1} lines: {ends}"
    assert all(end in "/.?&=-_:" for end in ends), f"lines end mid-word after {ends}"
    assert page_overflow(page) <= 0, f"the page scrolls sideways by {page_overflow(page)}px"


@pytest.mark.parametrize("size", SIZES)
def test_the_search_boxs_placeholder_is_not_cut_off(
    console_server: ConsoleServer, page: Any, size: str
) -> None:
    width, height = SIZES[size]
    page.set_viewport_size({"width": width, "height": height})
    page.goto(console_server.base_url + "/messages", wait_until="load")
    room = page.locator('input[name="q"]').evaluate(
        """el => { const style = getComputedStyle(el);
                   const context = document.createElement("canvas").getContext("2d");
                   context.font = style.font;
                   const text = context.measureText(el.placeholder).width;
                   const inner = el.clientWidth - parseFloat(style.paddingLeft)
                       - parseFloat(style.paddingRight);
                   return inner - text; }"""
    )
    assert room >= 0, f"the placeholder is cut off by {-room:.0f}px at {size}"


# --- navigation ---------------------------------------------------------------------------
def test_the_navigation_names_sites_and_the_audit_log_on_a_desktop(
    console_server: ConsoleServer, page: Any
) -> None:
    page.goto(console_server.base_url + "/")
    main_nav = page.get_by_role("navigation", name="Main")
    for label in ("Sites", "Audit log", "Site calls", "Failed messages"):
        expect(main_nav.get_by_role("link", name=label, exact=True)).to_be_visible()
    expect(page.get_by_text("Menu", exact=True)).to_be_hidden()


def test_on_a_phone_the_navigation_folds_behind_a_menu_button_worked_by_keyboard(
    console_server: ConsoleServer, page: Any
) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(console_server.base_url + "/")
    header = page.locator("header.topbar").bounding_box()
    assert header is not None and header["height"] <= 80, header
    expect(page.get_by_role("link", name="Sites", exact=True)).to_be_hidden()

    menu = page.get_by_text("Menu", exact=True)
    for _ in range(5):
        page.keyboard.press("Tab")
        if menu.evaluate("el => el === document.activeElement"):
            break
    assert menu.evaluate("el => el === document.activeElement"), "Tab never reached the menu"
    page.keyboard.press("Enter")
    sites = page.get_by_role("link", name="Sites", exact=True)
    expect(sites).to_be_visible()
    sites.focus()
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/sites$"))
    expect(page.get_by_role("link", name="Sites", exact=True)).to_be_hidden()


# --- edit of a large body -----------------------------------------------------------------
def test_the_edit_page_of_a_body_above_the_viewer_limit_offers_retry_and_download(
    console: TestClient, store: Any
) -> None:
    large = store("large-1", b"x" * (MAX_SHOWN_BYTES + 1), content_type="text/plain")
    small = store("small-1", b"y" * MAX_SHOWN_BYTES, content_type="text/plain")

    page = console.get(f"/messages/{large}/edit")
    assert page.status_code == 200
    assert len(page.content) < 64 * 1024, "the body was inlined"
    assert "too large to edit here" in page.text
    assert f'action="/messages/{large}/retry"' in page.text
    assert f'href="/messages/{large}/body"' in page.text
    assert "<textarea" not in page.text

    editable = console.get(f"/messages/{small}/edit")
    assert editable.status_code == 200
    assert 'name="body"' in editable.text
    assert "too large to edit here" not in editable.text
