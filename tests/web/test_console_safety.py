"""The console's safety in Chromium: message text stays text, a reader cannot act, every
console POST needs the session's CSRF token, and nothing loads from off the machine.

These properties do not depend on the database, so they run on SQLite only (the flows
of ``test_console_flow.py`` run on every provider).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect
from pydantic import SecretStr

from controlroom.config import AuthToken, Settings
from controlroom.db.tables import FailedMessageStatus, failed_messages
from tests.nsb import failed_headers
from tests.retries.conftest import TIMEOUT
from tests.web.conftest import ConsoleServer, ServerFactory

expect.set_options(timeout=TIMEOUT * 1000)

SCRIPT = "<script>document.title='x'</script>"
IMG = "<img src=x onerror=alert(1)>"
READER_TOKEN = "reader-token-0123456789"
OPERATOR_TOKEN = "operator-token-0123456789"


@pytest.fixture
def database_url(tmp_path: Path) -> Iterator[str]:
    """SQLite only in this module (see the module docstring)."""
    yield f"sqlite:///{tmp_path / 'controlroom.db'}"


@pytest.fixture
def secured(start_console: ServerFactory, settings: Settings) -> ConsoleServer:
    """The process with a reader and an operator token configured."""
    tokens = [
        AuthToken(name="rita", token=SecretStr(READER_TOKEN), role="reader"),
        AuthToken(name="oscar", token=SecretStr(OPERATOR_TOKEN), role="operator"),
    ]
    server = start_console(settings.model_copy(update={"auth_tokens": tokens}))
    server.publish(failed_headers("order-1"), b'{"sku": "fig"}')
    server.wait_until_stored(1)
    return server


def status_of(server: ConsoleServer, message_id: str) -> FailedMessageStatus:
    with server.engine.connect() as conn:
        status = conn.execute(
            sa.select(failed_messages.c.status).where(failed_messages.c.id == message_id)
        ).scalar_one()
    return FailedMessageStatus(status)


def only_message_id(server: ConsoleServer) -> str:
    with server.engine.connect() as conn:
        return str(conn.execute(sa.select(failed_messages.c.id)).scalar_one())


def sign_in(page: Any, server: ConsoleServer, token: str) -> None:
    page.goto(server.base_url + "/messages")
    expect(page).to_have_url(server.base_url + "/signin?next=%2Fmessages")
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(server.base_url + "/messages")


def csrf_token_of(page: Any) -> str:
    token: str = json.loads(page.get_attribute("body", "hx-headers"))["X-CSRF-Token"]
    return token


# --- message text is text -----------------------------------------------------------------
def test_markup_in_an_exception_message_and_a_body_is_shown_as_text_and_never_runs(
    console_server: ConsoleServer, page: Any
) -> None:
    headers = failed_headers("order-x", exception_message=SCRIPT, content_type="text/plain")
    console_server.publish(headers, IMG.encode())
    console_server.wait_until_stored(1)
    message_id = only_message_id(console_server)
    base = console_server.base_url

    for path in ["/", "/messages", "/messages?q=onerror", "/groups", f"/messages/{message_id}"]:
        page.goto(base + path)
        expect(page.locator("main h1")).to_be_visible()
        assert page.title().endswith("· Controlroom")  # the page's own, not 'x'
    expect(page.get_by_test_id("exception-message")).to_have_text(SCRIPT)
    expect(page.get_by_test_id("body")).to_have_text(IMG)
    expect(page.get_by_test_id("stack-trace")).to_contain_text(SCRIPT)
    assert page.title() != "x"
    assert page.locator("main script").count() == 0
    assert page.locator("img").count() == 0
    # The list shows the exception message as text too.
    page.goto(base + "/messages?q=onerror")
    expect(page.locator("table.messages")).to_contain_text(SCRIPT)
    assert page.title() == "Failed messages · Controlroom"
    # (The fence fails the test on any dialog, e.g. alert(1).)


# --- roles and CSRF -----------------------------------------------------------------------
def test_a_reader_sees_no_action_and_a_forged_post_from_its_session_is_refused(
    secured: ConsoleServer, page: Any, browser_context: Any
) -> None:
    sign_in(page, secured, READER_TOKEN)
    message_id = only_message_id(secured)
    page.goto(f"{secured.base_url}/messages/{message_id}")
    expect(page.get_by_test_id("status")).to_have_text("Unresolved")
    expect(page.get_by_role("button", name="Retry")).to_have_count(0)
    expect(page.get_by_role("button", name="Archive")).to_have_count(0)
    page.goto(f"{secured.base_url}/messages")
    expect(page.locator("input[name=ids]")).to_have_count(0)

    # The session cookie is HttpOnly and SameSite=Strict.
    (cookie,) = browser_context.cookies()
    assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")

    # A forged POST with the reader's own valid CSRF token: refused for the role.
    forged = page.request.post(
        f"{secured.base_url}/messages/{message_id}/retry",
        form={"csrf_token": csrf_token_of(page)},
        max_redirects=0,
    )
    assert forged.status == 403
    assert "reader" in forged.text()
    assert status_of(secured, message_id) is FailedMessageStatus.UNRESOLVED

    # The session is the console's alone: the API still wants its bearer token.
    assert page.request.get(f"{secured.base_url}/api/errors").status == 401


def test_a_console_post_without_the_sessions_csrf_token_is_refused(
    secured: ConsoleServer, page: Any
) -> None:
    sign_in(page, secured, OPERATOR_TOKEN)
    message_id = only_message_id(secured)
    archive = f"{secured.base_url}/messages/{message_id}/archive"

    missing = page.request.post(archive, form={}, max_redirects=0)
    wrong = page.request.post(archive, form={"csrf_token": "not-the-token"}, max_redirects=0)
    assert (missing.status, wrong.status) == (403, 403)
    assert "CSRF" in missing.text()
    assert status_of(secured, message_id) is FailedMessageStatus.UNRESOLVED

    # The operator's own button, which carries the token, works.
    page.goto(f"{secured.base_url}/messages/{message_id}")
    page.get_by_role("button", name="Archive", exact=True).click()
    expect(page.get_by_test_id("status")).to_have_text("Archived")


def test_signing_in_with_an_unknown_token_is_refused(secured: ConsoleServer, page: Any) -> None:
    page.goto(secured.base_url + "/")
    page.get_by_label("Token").fill("not-a-token-at-all-0000")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("That token is not valid.")
    page.goto(secured.base_url + "/messages")
    expect(page).to_have_url(secured.base_url + "/signin?next=%2Fmessages")


# --- offline ------------------------------------------------------------------------------
def test_the_console_and_the_api_docs_load_with_every_request_off_loopback_blocked(
    console_server: ConsoleServer, page: Any, fence: Any
) -> None:
    console_server.publish(failed_headers("order-1"), b'{"sku": "fig"}')
    console_server.wait_until_stored(1)
    message_id = only_message_id(console_server)
    base = console_server.base_url
    for path in ["/", "/messages", f"/messages/{message_id}", "/groups", "/endpoints"]:
        page.goto(base + path)
        expect(page.locator("main h1")).to_be_visible()
        assert page.evaluate("typeof htmx") == "object"  # the packaged htmx loaded
        if path.startswith("/messages/"):  # htmx fetched the body
            expect(page.get_by_test_id("body")).to_contain_text('"sku": "fig"')

    page.goto(base + "/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Controlroom")
    expect(page.locator(".opblock-summary-path").first).to_be_visible()
    page.get_by_role("link", name="Back to the console").click()  # the way back
    expect(page).to_have_url(base + "/")
    expect(page.locator("main h1")).to_be_visible()
    assert fence.blocked == []  # (and the fence checks again at teardown)
