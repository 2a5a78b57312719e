"""The console's site-call pages in Chromium: a Parked call retried from its page shows
the relay's outcome (a real site agent on loopback), the KPI tiles equal
``/api/site-calls/kpis``, site text stays text, a reader cannot act, and the pages load
with every request off loopback blocked.

The retry and KPI flows run on every provider; the safety checks do not depend on the
database and run on SQLite only (as in ``test_console_safety.py``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from playwright.sync_api import expect
from pydantic import SecretStr

from controlroom.config import AuthToken, Settings
from controlroom.db.tables import audit_log
from controlroom.site import SiteSettings
from tests.reconciliation.harness import SITE_TOKEN, as_site, running_agent, site_entry
from tests.retries.conftest import TIMEOUT
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.site.http import loopback_listener, url_of
from tests.web.conftest import ConsoleServer, ServerFactory
from tests.web.test_console_safety import (
    IMG,
    OPERATOR_TOKEN,
    READER_TOKEN,
    SCRIPT,
    csrf_token_of,
)

expect.set_options(timeout=TIMEOUT * 1000)

TILES = ("buffered", "parked", "failed_last_interval", "delivered_last_interval", "stuck")


def packet(
    status: str,
    *,
    created: datetime,
    updated: datetime | None = None,
    terminal: datetime | None = None,
    site: str = "plant-7",
    node: str | None = "node-a",
    target: str = "https://erp.example.com/api/orders",
    last_error: str | None = None,
    event: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One telemetry packet of a new call (the README's contract)."""
    call_id = str(uuid.uuid4())
    body: dict[str, Any] = {
        "tracked_operation_id": call_id,
        "channel": "ApiOutbound",
        "target": target,
        "source_site": site,
        "source_node": node,
        "status": status,
        "retry_count": 0,
        "last_error": last_error,
        "http_status": None,
        "created_at_utc": created.isoformat(),
        "updated_at_utc": (updated or terminal or created).isoformat(),
        "terminal_at_utc": terminal.isoformat() if terminal else None,
        "epoch": 0,
    }
    if event is not None:
        body["audit_event"] = {
            "event_id": str(uuid.uuid4()),
            "occurred_at_utc": (updated or created).isoformat(),
            "outcome": "Success",
            "category": "CachedCall",
            "correlation_id": call_id,
            **event,
        }
    return body


def post_telemetry(server: ConsoleServer, packets: list[dict[str, Any]], **headers: str) -> None:
    answer = httpx.post(
        f"{server.base_url}/api/site-calls/telemetry",
        json=packets,
        headers=headers,
        timeout=TEST_CLIENT_TIMEOUT,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["rejected"] == [], answer.json()


# --- the relay from the call's page ------------------------------------------------------
def test_a_parked_call_retried_from_its_page_shows_the_relays_outcome(
    start_console: ServerFactory, settings: Settings, page: Any, tmp_path: Path
) -> None:
    listener = loopback_listener()
    site_settings = SiteSettings(
        site_id="plant-7",
        node="node-a",
        store_path=tmp_path / "site" / "tracking.db",
        token=SITE_TOKEN,
        max_retries=1,
        backoff_base=3600,
        backoff_cap=3600,
    )
    attempts: list[object] = []
    delivering = False

    def operation(payload: object) -> None:
        attempts.append(payload)
        if not delivering:
            raise ConnectionError("target unreachable")

    with running_agent(site_settings, listener) as agent:
        server = start_console(
            settings.model_copy(update={"sites": [site_entry("plant-7", url_of(listener))]})
        )
        agent.register("erp", operation)
        call_id = agent.cached_call("erp/stock", "erp", {"sku": "fig"}).tracked_operation_id
        reported = [p for _, p in agent.store.pending_packets(100)]
        post_telemetry(server, reported, **as_site("plant-7"))

        page.goto(server.base_url + "/site-calls?status=Parked")
        page.get_by_role("link", name="erp/stock").click()
        expect(page).to_have_url(f"{server.base_url}/site-calls/{call_id}")
        expect(page.get_by_test_id("status")).to_have_text("Parked")

        delivering = True
        # The redirect's page has loaded (its load event fired) before reloads are counted.
        with page.expect_navigation(wait_until="load"):
            page.get_by_role("button", name="Retry", exact=True).click()
        expect(page.get_by_test_id("flash-code")).to_have_text("Applied")
        expect(page.get_by_test_id("flash")).to_contain_text("site plant-7 applied")
        # The relay's audit event, by the console's operator, is on the call's page.
        expect(page.locator("table")).to_contain_text("CachedResolve")
        expect(page.locator("table")).to_contain_text("anonymous")

        # Central's copy says Parked until the site's telemetry arrives: the page says the
        # command was applied there and offers no Retry or Discard as if nothing happened.
        expect(page.get_by_test_id("awaiting-site")).to_contain_text("when the site reports")
        for button in ("Retry", "Discard"):
            expect(page.get_by_role("button", name=button, exact=True)).to_have_count(0)
        loads: list[str] = []
        page.on("load", lambda _: loads.append(page.url))

        # The site reports the call delivered: the page shows it without a reload.
        parked = next(p for p in reported if p["status"] == "Parked")
        reported_at = datetime.fromisoformat(parked["updated_at_utc"])
        later = (reported_at + timedelta(seconds=1)).isoformat()
        delivered = {
            **{k: v for k, v in parked.items() if k != "audit_event"},
            "status": "Delivered",
            "updated_at_utc": later,
            "terminal_at_utc": later,
        }
        post_telemetry(server, [delivered], **as_site("plant-7"))
        expect(page.get_by_test_id("status")).to_have_text("Delivered")
        expect(page.get_by_test_id("awaiting-site")).to_have_count(0)
        assert loads == [], "the page was loaded again"


def test_a_retry_to_a_site_that_does_not_answer_shows_site_unreachable(
    start_console: ServerFactory, settings: Settings, page: Any
) -> None:
    closed = loopback_listener()
    dead_url = url_of(closed)
    closed.close()  # nothing listens there any more
    server = start_console(settings.model_copy(update={"sites": [site_entry("plant-7", dead_url)]}))
    now = datetime.now(UTC)
    parked = packet("Parked", created=now - timedelta(minutes=5), last_error="HTTP 503")
    post_telemetry(server, [parked], **as_site("plant-7"))

    page.goto(f"{server.base_url}/site-calls/{parked['tracked_operation_id']}")
    page.get_by_role("button", name="Retry", exact=True).click()
    expect(page.get_by_test_id("flash-code")).to_have_text("SiteUnreachable")
    expect(page.get_by_test_id("status")).to_have_text("Parked")


# --- KPI tiles ----------------------------------------------------------------------------
def kpi_packets(now: datetime) -> list[dict[str, Any]]:
    """Calls whose KPIs cannot change while the test runs: terminal a minute ago (the
    interval is an hour), pending for a minute or half an hour (the stuck threshold is
    ten minutes)."""
    minute, half_hour = now - timedelta(minutes=1), now - timedelta(minutes=30)
    return [
        *[packet("Submitted", created=minute) for _ in range(3)],
        *[packet("Attempted", created=half_hour, node="node-b") for _ in range(2)],
        *[packet("Parked", created=half_hour, site="plant-9") for _ in range(4)],
        *[packet("Delivered", created=half_hour, terminal=minute) for _ in range(5)],
        *[packet("Failed", created=half_hour, terminal=minute, site="plant-9")],
    ]


def tile_figures(page: Any) -> dict[str, int]:
    return {
        metric: int(page.get_by_test_id(f"kpi-{metric}").locator(".figure").inner_text())
        for metric in TILES
    }


def test_the_kpi_tiles_equal_the_kpi_api_globally_and_per_site_and_node(
    console_server: ConsoleServer, page: Any
) -> None:
    post_telemetry(console_server, kpi_packets(datetime.now(UTC)))
    api = f"{console_server.base_url}/api/site-calls/kpis"
    scopes = [
        ("/", {}),
        ("/site-calls", {}),
        ("/site-calls?scope_site=plant-9", {"site": "plant-9"}),
        ("/site-calls?scope_site=plant-7&scope_node=node-b", {"site": "plant-7", "node": "node-b"}),
    ]
    seen = []
    for path, params in scopes:
        before = httpx.get(api, params=params, timeout=TEST_CLIENT_TIMEOUT).json()
        page.goto(console_server.base_url + path)
        after = httpx.get(api, params=params, timeout=TEST_CLIENT_TIMEOUT).json()
        figures = tile_figures(page)
        assert figures == {metric: after[metric] for metric in TILES}
        # The age grows while the test runs: the tile's lies between the two answers.
        seconds = page.get_by_test_id("kpi-oldest_pending_age_seconds").get_attribute(
            "data-seconds"
        )
        if after["oldest_pending_age_seconds"] is None:
            assert seconds == ""
        else:
            age = float(seconds)
            assert (
                before["oldest_pending_age_seconds"] <= age <= after["oldest_pending_age_seconds"]
            )
        seen.append(figures)
    assert seen[0]["parked"] == 4 and seen[2]["parked"] == 4 and seen[3]["stuck"] == 2
    # The scope picker leads to the same page of one node.
    page.goto(console_server.base_url + "/site-calls")
    page.get_by_role("navigation", name="KPI scope").get_by_role("link", name="node-b").click()
    expect(page.locator("main h1")).to_contain_text("plant-7 / node-b")
    assert tile_figures(page) == seen[3]


# --- text from a site is text -------------------------------------------------------------
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_markup_in_a_site_calls_target_error_and_audit_event_is_shown_as_text(
    console_server: ConsoleServer, page: Any
) -> None:
    now = datetime.now(UTC)
    hostile = packet(
        "Parked",
        created=now - timedelta(minutes=3),
        target=SCRIPT,
        last_error=IMG,
        site="plant-<b>7</b>",
        event={
            "actor": SCRIPT,
            "action": IMG,
            "target": SCRIPT,
            "details_json": f'{{"x": "{IMG}"}}',
        },
    )
    post_telemetry(console_server, [hostile])
    base = console_server.base_url
    call_page = f"/site-calls/{hostile['tracked_operation_id']}"
    for path, title in [
        ("/site-calls", "Site calls · Controlroom"),
        (call_page, f"Site call {hostile['tracked_operation_id']} · Controlroom"),
        ("/audit-log", "Audit log · Controlroom"),
        ("/", "Dashboard · Controlroom"),
    ]:
        page.goto(base + path)
        expect(page.locator("main h1")).to_be_visible()
        assert page.title() == title
    page.goto(base + call_page)
    expect(page.locator("main h1")).to_have_text(SCRIPT)
    expect(page.get_by_test_id("last-error")).to_have_text(IMG)
    expect(page.locator("main img")).to_have_count(0)
    expect(page.locator("main table")).to_contain_text(IMG)
    page.goto(base + "/site-calls")
    expect(page.get_by_test_id("call-target")).to_have_text(SCRIPT)
    expect(page.locator("main b")).to_have_count(0)
    page.goto(base + "/audit-log")
    expect(page.locator("main table")).to_contain_text(SCRIPT)
    expect(page.locator("main img, main script")).to_have_count(0)
    assert page.title() == "Audit log · Controlroom"
    # (The fence fails the test on any dialog, e.g. alert(1).)


# --- roles and CSRF -----------------------------------------------------------------------
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_reader_sees_no_retry_or_discard_and_its_forged_post_is_refused(
    start_console: ServerFactory, settings: Settings, page: Any
) -> None:
    tokens = [
        AuthToken(name="rita", token=SecretStr(READER_TOKEN), role="reader"),
        AuthToken(name="oscar", token=SecretStr(OPERATOR_TOKEN), role="operator"),
    ]
    sites = [site_entry("plant-7", "http://127.0.0.1:9")]
    server = start_console(settings.model_copy(update={"auth_tokens": tokens, "sites": sites}))
    parked = packet("Parked", created=datetime.now(UTC) - timedelta(minutes=2))
    post_telemetry(server, [parked], **as_site("plant-7"))
    call_page = f"{server.base_url}/site-calls/{parked['tracked_operation_id']}"

    page.goto(call_page)
    page.get_by_label("Token").fill(READER_TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(call_page)
    expect(page.get_by_test_id("status")).to_have_text("Parked")
    expect(page.get_by_role("button", name="Retry")).to_have_count(0)
    expect(page.get_by_role("button", name="Discard")).to_have_count(0)

    for command in ("retry", "discard"):
        forged = page.request.post(
            f"{call_page}/{command}", form={"csrf_token": csrf_token_of(page)}, max_redirects=0
        )
        assert forged.status == 403
        assert "reader" in forged.text()
        missing = page.request.post(f"{call_page}/{command}", form={}, max_redirects=0)
        assert missing.status == 403
        assert "CSRF" in missing.text()
    with server.engine.connect() as conn:  # nothing was relayed: no CachedResolve event
        assert conn.execute(sa.select(sa.func.count()).select_from(audit_log)).scalar_one() == 0


# --- offline ------------------------------------------------------------------------------
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_site_call_pages_load_with_every_request_off_loopback_blocked(
    start_console: ServerFactory, settings: Settings, page: Any, fence: Any
) -> None:
    server = start_console(
        settings.model_copy(update={"sites": [site_entry("plant-7", "http://127.0.0.1:9")]})
    )
    now = datetime.now(UTC)
    parked = packet(
        "Parked",
        created=now - timedelta(minutes=2),
        event={"actor": "plant-7/node-a", "action": "CallParked"},
    )
    post_telemetry(server, [parked], **as_site("plant-7"))
    for path in [
        "/",
        "/site-calls",
        f"/site-calls/{parked['tracked_operation_id']}",
        "/site-calls/rejected",
        "/sites",
        "/audit-log",
        "/failed-imports",
        "/event-log",
    ]:
        page.goto(server.base_url + path)
        expect(page.locator("main h1")).to_be_visible()
        assert page.evaluate("typeof htmx") == "object"
    page.goto(server.base_url + "/audit-log")
    expect(page.locator("main table")).to_contain_text("CallParked")
    assert fence.blocked == []  # (and the fence checks again at teardown)
