"""A parked notification's Retry and Discard in Chromium, on every provider: each POST
answers with a redirect to the notification's page, which shows the outcome once (docs/decisions.md
"Console actions answer with a redirect"), so a reload or going back sends nothing again;
a reader sees no buttons, and a POST from its session is refused."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from playwright.sync_api import expect
from pydantic import SecretStr

from controlroom.config import AuthToken, Settings
from controlroom.db.tables import audit_log, notifications
from tests.notifications.test_api import put
from tests.retries.conftest import TIMEOUT
from tests.web.conftest import ConsoleServer, ServerFactory
from tests.web.test_console_post_redirect_get import record_posts
from tests.web.test_console_safety import (
    OPERATOR_TOKEN,
    READER_TOKEN,
    csrf_token_of,
    sign_in,
)

expect.set_options(timeout=TIMEOUT * 1000)
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def secured(start_console: ServerFactory, settings: Settings) -> ConsoleServer:
    tokens = [
        AuthToken(name="rita", token=SecretStr(READER_TOKEN), role="reader"),
        AuthToken(name="oscar", token=SecretStr(OPERATOR_TOKEN), role="operator"),
    ]
    outbox = {"webhooks": [{"name": "ops", "url": "http://127.0.0.1:9/x", "secret": SECRET}]}
    return start_console(
        settings.model_copy(
            update={
                "auth_tokens": tokens,
                "notifications": settings.notifications.model_validate(outbox),
            }
        )
    )


def status_of(server: ConsoleServer, notification_id: str) -> str:
    with server.engine.connect() as conn:
        return conn.execute(
            sa.select(notifications.c.status).where(
                notifications.c.notification_id == notification_id
            )
        ).scalar_one()


def audit_rows(server: ConsoleServer) -> list[str]:
    with server.engine.connect() as conn:
        return list(conn.execute(sa.select(audit_log.c.action)).scalars())


def test_retry_and_discard_redirect_and_a_reload_or_back_sends_nothing(
    start_console: ServerFactory, settings: Settings, page: Any
) -> None:
    server = secured(start_console, settings)
    sign_in(page, server, OPERATOR_TOKEN)
    for button, after in (("Discard", "Discarded"), ("Retry", None)):
        notification_id = put(server.engine)
        url = f"{server.base_url}/notifications/{notification_id}"
        page.goto(url)
        expect(page.get_by_test_id("status")).to_have_text("Parked")
        posts = record_posts(page)
        page.get_by_role("button", name=button, exact=True).click()
        expect(page.get_by_test_id("flash-code")).to_have_text("Applied")
        # the notification's page, fetched by GET, the outcome in the signed flash only
        expect(page).to_have_url(url)
        assert posts == [f"{url}/{button.lower()}"]
        page.reload()
        page.go_back()
        page.go_forward()
        assert posts == [f"{url}/{button.lower()}"], "a reload or back sent it again"
        assert status_of(server, notification_id) != "Parked"
        if after is not None:
            assert status_of(server, notification_id) == after
        expect(page.get_by_role("button", name=button, exact=True)).to_have_count(0)
    assert sorted(audit_rows(server)) == ["NotificationDiscarded", "NotificationRetried"]


def test_the_page_follows_a_retried_notification_live_and_says_the_outcome_once(
    start_console: ServerFactory, settings: Settings, page: Any
) -> None:
    server = secured(start_console, settings)
    sign_in(page, server, OPERATOR_TOKEN)
    notification_id = put(server.engine)
    page.goto(f"{server.base_url}/notifications/{notification_id}")
    # The redirect's page has loaded (its load event fired) before reloads are counted.
    with page.expect_navigation(wait_until="load"):
        page.get_by_role("button", name="Retry", exact=True).click()
    expect(page.get_by_test_id("flash-code")).to_have_text("Applied")
    flash = page.get_by_test_id("flash").inner_text()
    assert flash.count("Applied") == 1, flash
    expect(page.get_by_test_id("status")).not_to_have_text("Parked")
    loads: list[str] = []
    page.on("load", lambda _: loads.append(page.url))

    with server.engine.begin() as conn:  # its next attempts fail: it parks again
        conn.execute(
            sa.update(notifications)
            .where(notifications.c.notification_id == notification_id)
            .values(status="Parked", retry_count=notifications.c.retry_count + 1)
        )

    expect(page.get_by_test_id("status")).to_have_text("Parked")
    expect(page.get_by_role("button", name="Retry", exact=True)).to_have_count(1)
    # The live part changed what the flash described: the flash has gone.
    expect(page.get_by_test_id("flash")).to_have_count(0)
    assert loads == [], "the page was loaded again"


def test_an_outcome_banner_goes_after_a_while_when_nothing_live_changes(
    start_console: ServerFactory, settings: Settings, page: Any
) -> None:
    """A notice whose live part does not change goes by itself (the browser's clock run
    forward, not a wait); while shown it is a status for assistive technology."""
    server = secured(start_console, settings)
    sign_in(page, server, OPERATOR_TOKEN)
    notification_id = put(server.engine)
    page.clock.install()
    page.goto(f"{server.base_url}/notifications/{notification_id}")
    page.get_by_role("button", name="Retry", exact=True).click()
    flash = page.get_by_test_id("flash")
    expect(page.get_by_test_id("flash-code")).to_have_text("Applied")
    expect(flash).to_have_attribute("role", "status")
    status = page.get_by_test_id("status").inner_text()
    page.clock.fast_forward("00:06")  # a poll or so later: long enough to read
    expect(flash).to_be_visible()
    page.clock.fast_forward("01:00")
    expect(flash).to_have_count(0)
    assert page.get_by_test_id("status").inner_text() == status  # nothing live changed


def test_a_reader_sees_no_buttons_and_a_post_from_its_session_is_refused(
    start_console: ServerFactory, settings: Settings, page: Any
) -> None:
    server = secured(start_console, settings)
    notification_id = put(server.engine)
    sign_in(page, server, READER_TOKEN)
    url = f"{server.base_url}/notifications/{notification_id}"
    page.goto(url)
    expect(page.get_by_test_id("status")).to_have_text("Parked")
    expect(page.get_by_role("button", name="Retry", exact=True)).to_have_count(0)
    expect(page.get_by_role("button", name="Discard", exact=True)).to_have_count(0)
    for action in ("retry", "discard"):
        forged = page.request.post(
            f"{url}/{action}", form={"csrf_token": csrf_token_of(page)}, max_redirects=0
        )
        assert forged.status == 403
    assert status_of(server, notification_id) == "Parked"
    assert audit_rows(server) == []
