"""Console actions in Chromium: every POST answers with a redirect to a page that shows
the outcome once (docs/decisions.md "Console actions answer with a redirect"), so a
reload or going back sends nothing again, and a refused action says why once; Retry/
Discard are offered only on calls of sites central can reach, and the page says why
otherwise.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from playwright.sync_api import expect
from pydantic import SecretStr
from starlette.requests import Request
from starlette.responses import Response

from controlroom.config import AuthToken, Settings
from controlroom.errors.ingest.pipeline import make_failed_import
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.web.flash import COOKIE_NAME, Flash, set_flash
from tests.reconciliation.harness import as_site, site_entry
from tests.retries.conftest import TIMEOUT
from tests.site.http import loopback_listener, url_of
from tests.web.conftest import ConsoleServer, ServerFactory
from tests.web.test_console_http import csrf_of
from tests.web.test_console_safety import OPERATOR_TOKEN
from tests.web.test_console_sitecalls import packet, post_telemetry

expect.set_options(timeout=TIMEOUT * 1000)


def record_posts(page: Any) -> list[str]:
    """The URLs of every POST the page sends from now on."""
    posts: list[str] = []
    page.on(
        "request", lambda request: posts.append(request.url) if request.method == "POST" else None
    )
    return posts


def parked_call_of_a_dead_site(
    start_console: ServerFactory, settings: Settings
) -> tuple[ConsoleServer, str]:
    closed = loopback_listener()
    dead_url = url_of(closed)
    closed.close()  # nothing listens there any more
    server = start_console(settings.model_copy(update={"sites": [site_entry("plant-7", dead_url)]}))
    parked = packet("Parked", created=datetime.now(UTC) - timedelta(minutes=5), last_error="503")
    post_telemetry(server, [parked], **as_site("plant-7"))
    return server, parked["tracked_operation_id"]


def test_a_reload_after_retry_or_discard_of_a_site_call_sends_nothing(
    start_console: ServerFactory, settings: Settings, page: Any
) -> None:
    server, call_id = parked_call_of_a_dead_site(start_console, settings)
    call_url = f"{server.base_url}/site-calls/{call_id}"
    for button in ("Retry", "Discard"):
        page.goto(call_url)
        posts = record_posts(page)
        page.get_by_role("button", name=button, exact=True).click()
        expect(page.get_by_test_id("flash-code")).to_have_text("SiteUnreachable")
        expect(page.get_by_test_id("flash")).to_contain_text(f"{button}: the site could not")
        expect(page).to_have_url(call_url)  # the call's page, fetched by GET
        assert posts == [f"{call_url}/{button.lower()}"]

        page.reload()
        expect(page.get_by_test_id("status")).to_have_text("Parked")
        expect(page.get_by_test_id("flash")).to_have_count(0)  # shown once
        page.go_back()
        page.go_forward()
        assert posts == [f"{call_url}/{button.lower()}"], "a reload or back sent it again"


def test_retry_and_discard_are_not_offered_for_a_site_central_has_no_address_for(
    start_console: ServerFactory, settings: Settings, page: Any
) -> None:
    server = start_console(settings)  # no sites configured: the open loopback API
    parked = packet("Parked", created=datetime.now(UTC) - timedelta(minutes=5), site="plant-9")
    post_telemetry(server, [parked])

    page.goto(f"{server.base_url}/site-calls/{parked['tracked_operation_id']}")
    expect(page.get_by_test_id("status")).to_have_text("Parked")
    expect(page.get_by_role("button", name="Retry", exact=True)).to_have_count(0)
    expect(page.get_by_role("button", name="Discard", exact=True)).to_have_count(0)
    expect(page.get_by_test_id("relay-unavailable")).to_contain_text(
        "site 'plant-9' is not configured at central"
    )


def test_a_reload_after_a_refused_sign_in_sends_no_token_again(
    start_console: ServerFactory, settings: Settings, page: Any
) -> None:
    tokens = [AuthToken(name="oscar", token=SecretStr(OPERATOR_TOKEN), role="operator")]
    secured = start_console(settings.model_copy(update={"auth_tokens": tokens}))
    page.goto(secured.base_url + "/messages")
    posts = record_posts(page)
    page.get_by_label("Token").fill("not-a-token-at-all-0000")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("That token is not valid.")
    page.reload()
    expect(page.get_by_label("Token")).to_be_visible()
    assert posts == [f"{secured.base_url}/signin"], "the reload sent the token again"


def test_a_refused_action_redirects_to_a_page_that_says_why_once(
    console: TestClient, store: Any, writer: FailedMessageBatchWriter
) -> None:
    message_id = store("order-1", b"{}")
    page = f"/messages/{message_id}"
    token = csrf_of(console.get(page).text)
    assert console.post(f"{page}/archive", data={"csrf_token": token}).status_code == 303

    refused = console.post(f"{page}/retry", data={"csrf_token": token})
    assert refused.status_code == 303 and refused.headers["location"] == page
    shown = console.get(page).text
    assert 'data-testid="flash-code">Refused<' in shown
    assert f"Cannot retry: {message_id} is archived" in shown
    assert 'data-testid="flash"' not in console.get(page).text  # once

    kept = make_failed_import({"n": "1"}, b"\xff", queue="error", reason="r")
    writer.write(IngestionBatch(failed_imports=[kept]))
    no_transport = console.post(f"/failed-imports/{kept.id}/reimport", data={"csrf_token": token})
    assert no_transport.status_code == 303
    assert no_transport.headers["location"] == "/failed-imports"
    assert "This process has no transport to publish with." in console.get("/failed-imports").text


def test_a_flash_not_signed_for_the_session_is_not_shown(console: TestClient) -> None:
    console.get("/site-calls")  # the open console's session
    forged = Response()
    request = Request({"type": "http", "scheme": "http", "path": "/", "headers": []})
    set_flash(forged, request, b"\x00" * 32, Flash("error", "Call +1 555 0100 now"))
    console.cookies.set(COOKIE_NAME, forged.headers["set-cookie"].split(";")[0].split("=", 1)[1])
    assert "Call +1 555 0100 now" not in console.get("/site-calls").text
