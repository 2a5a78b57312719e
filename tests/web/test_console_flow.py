"""An operator's paths through the console, clicked in Chromium, on every provider.

The process runs as ``controlroom serve`` runs it (ingestion, retry processor, HTTP); the
failed messages reach it through the embedded error queue. See ``conftest.py`` for the
fence every page runs in (no request off 127.0.0.1, no dialog).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import sqlalchemy as sa
from playwright.sync_api import expect

from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.retries import wire as retry_wire
from tests.nsb import failed_headers
from tests.retries.conftest import TIMEOUT
from tests.web.conftest import ConsoleServer

expect.set_options(timeout=TIMEOUT * 1000)


def test_an_operator_finds_a_message_by_a_body_term_retries_it_and_sees_it_resolved(
    console_server: ConsoleServer, page: Any
) -> None:
    bodies = {
        "order-1": b'{"sku": "kumquat-7", "quantity": 2}',
        "order-2": b'{"sku": "apple-1", "quantity": 1}',
        "order-3": b'{"sku": "pear-3", "quantity": 5}',
    }
    for message_id, body in bodies.items():
        console_server.publish(failed_headers(message_id, endpoint="Sales"), body)
    console_server.wait_until_stored(3)

    page.goto(console_server.base_url + "/")
    expect(page.locator("#tile-unresolved")).to_have_text("3")
    page.get_by_text("Unresolved failed messages").click()
    expect(page).to_have_url(re.compile(r"/messages\?status=unresolved$"))
    expect(page.get_by_test_id("total")).to_have_text("3 messages")

    page.get_by_label("Search").fill("kumquat")
    page.get_by_role("button", name="Apply").click()
    expect(page.get_by_test_id("total")).to_have_text("1 message")
    page.locator("table.messages tbody a").first.click()

    expect(page.get_by_test_id("status")).to_have_text("Unresolved")
    expect(page.get_by_test_id("body")).to_contain_text('"sku": "kumquat-7"')
    page.get_by_role("button", name="Retry", exact=True).click()
    expect(page.get_by_test_id("status")).to_have_text("RetryIssued")
    expect(page.get_by_role("status").filter(has_text="message(s)")).to_be_visible()

    # The endpoint takes the retried message and confirms it; the page, polling, follows.
    consumer = console_server.start_consumer("Sales")
    expect(page.get_by_test_id("status")).to_have_text("Resolved")
    (delivery,) = consumer.processed
    assert delivery.body == bodies["order-1"]
    assert consumer.confirmed == [True]
    assert delivery.headers[retry_wire.RETRY_UNIQUE_MESSAGE_ID] in page.url


def test_archiving_three_selected_messages_drops_the_group_count_and_unarchiving_restores_it(
    console_server: ConsoleServer, page: Any
) -> None:
    for n in range(4):  # one exception type and stack trace: one group of four
        console_server.publish(failed_headers(f"order-{n}"), b'{"n": %d}' % n)
    console_server.wait_until_stored(4)
    base = console_server.base_url

    page.goto(base + "/groups")
    expect(page.get_by_test_id("group-count")).to_have_text("4")

    page.goto(base + "/messages")
    boxes = page.locator("table.messages input[name=ids]")
    expect(boxes).to_have_count(4)
    for index in range(3):
        boxes.nth(index).check()
    page.get_by_role("button", name="Archive selected", exact=True).click()
    expect(page.get_by_role("status").filter(has_text="Archived 3 message(s).")).to_be_visible()
    expect(page.get_by_test_id("total")).to_have_text("1 message")

    page.goto(base + "/groups")
    expect(page.get_by_test_id("group-count")).to_have_text("1")
    page.goto(base + "/")
    expect(page.locator("#tile-unresolved")).to_have_text("1")

    page.goto(base + "/messages?status=archived")
    expect(page.get_by_test_id("total")).to_have_text("3 messages")
    page.get_by_label("Select all on this page").check()
    page.get_by_role("button", name="Unarchive selected").click()
    expect(page.get_by_role("status").filter(has_text="Unarchived 3 message(s).")).to_be_visible()

    page.goto(base + "/groups")
    expect(page.get_by_test_id("group-count")).to_have_text("4")


def test_a_group_retry_shows_its_progress_until_every_message_is_sent(
    console_server: ConsoleServer, page: Any
) -> None:
    for n in range(5):
        console_server.publish(failed_headers(f"order-{n}"), b'{"n": %d}' % n)
    console_server.wait_until_stored(5)

    page.goto(console_server.base_url + "/groups")
    expect(page.get_by_test_id("group-count")).to_have_text("5")
    page.get_by_role("button", name="Retry group").click()
    # The table polls while the retry runs, and ends on its outcome.
    expect(page.get_by_role("status").filter(has_text="Last retry: 5 sent")).to_be_visible()
    with console_server.engine.connect() as conn:
        statuses = conn.execute(sa.select(failed_messages.c.status)).scalars().all()
    assert statuses == [int(FailedMessageStatus.RETRY_ISSUED)] * 5


def test_edit_and_retry_sends_the_edited_body_and_resolves_the_original(
    console_server: ConsoleServer, page: Any
) -> None:
    console_server.publish(failed_headers("order-1"), b'{"sku": "fig", "quantity": -1}')
    console_server.wait_until_stored(1)

    page.goto(console_server.base_url + "/messages")
    page.locator("table.messages tbody a").first.click()
    page.get_by_role("link", name="Edit and retry").click()
    page.get_by_label("Body").fill('{"sku": "fig", "quantity": 1}')
    page.get_by_role("button", name="Send the edited copy").click()
    expect(page.get_by_test_id("status")).to_have_text("Resolved")
    expect(
        page.get_by_role("status").filter(has_text="The edited message was sent")
    ).to_be_visible()

    consumer = console_server.start_consumer("Sales")
    console_server.run(_until(lambda: bool(consumer.processed)))
    (delivery,) = consumer.processed
    assert delivery.body == b'{"sku": "fig", "quantity": 1}'


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.05)
