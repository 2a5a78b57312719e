"""The failed imports and event log pages in Chromium, on every provider: a failed import
is listed with its reason (as text), re-imported from the page and ingested again; the
event log shows what happened, newest first; a reader sees no Re-import."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient
from playwright.sync_api import expect

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import make_failed_import
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.read.counts import count_failed_imports
from tests.nsb import failed_headers
from tests.retries.conftest import TIMEOUT, wait_for_sync
from tests.web.conftest import ConsoleServer
from tests.web.test_console_http import READER, TOKENS, csrf_of
from tests.web.test_console_safety import IMG

expect.set_options(timeout=TIMEOUT * 1000)


def keep_failed_imports(server: ConsoleServer, count: int, reason: str) -> None:
    """``count`` failed imports whose headers are a whole failed message's (so a
    re-import is ingested as a failed message), kept for ``reason``."""
    kept = [
        make_failed_import(
            failed_headers(f"order-{n}"), b'{"sku": "fig"}', queue="error", reason=reason
        )
        for n in range(count)
    ]
    FailedMessageBatchWriter(server.engine).write(IngestionBatch(failed_imports=kept))


def failed_imports(server: ConsoleServer) -> int:
    with server.engine.connect() as conn:
        return count_failed_imports(conn)


def test_failed_imports_are_listed_with_reasons_and_re_imported_from_the_page(
    console_server: ConsoleServer, page: Any
) -> None:
    keep_failed_imports(console_server, 3, f"the broker said {IMG}")
    base = console_server.base_url

    page.goto(base + "/")
    page.get_by_role("link", name="Failed imports").first.click()
    expect(page).to_have_url(base + "/failed-imports")
    expect(page.get_by_test_id("total")).to_have_text("3 failed imports")
    expect(page.get_by_test_id("reason").first).to_have_text(f"the broker said {IMG}")
    expect(page.locator("main img")).to_have_count(0)

    page.get_by_role("button", name="Re-import", exact=True).first.click()
    expect(page.get_by_role("status")).to_contain_text("Re-imported")
    console_server.wait_until_stored(1)  # ingested again, as a failed message

    page.get_by_role("button", name="Re-import all").click()
    expect(page.get_by_role("status")).to_contain_text("Re-imported 2")
    console_server.wait_until_stored(3)
    wait_for_sync(lambda: failed_imports(console_server) == 0)

    page.goto(base + "/event-log")
    expect(page.locator("main h1")).to_have_text("Event log")
    # Three kept (their reasons as text), then three put back by the console's operator
    # (beside them, the failure groups their ingestion made).
    rows = page.get_by_test_id("event").filter(has_text="failed import")
    expect(rows).to_have_count(6)
    expect(rows.first).to_have_text("1 failed import put back on error by anonymous")
    expect(rows.last).to_contain_text("was kept as failed import")
    expect(rows.last).to_contain_text(f"the broker said {IMG}")
    expect(page.locator("main img")).to_have_count(0)


def test_the_event_log_is_newest_first(console_server: ConsoleServer, page: Any) -> None:
    keep_failed_imports(console_server, 1, "no FailedQ")
    page.goto(console_server.base_url + "/failed-imports")
    page.get_by_role("button", name="Re-import", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text("Re-imported")
    console_server.wait_until_stored(1)
    message_id = None
    with console_server.engine.connect() as conn:
        message_id = conn.execute(sa.text("select id from failed_messages")).scalar_one()
    page.goto(f"{console_server.base_url}/messages/{message_id}")
    page.get_by_role("button", name="Archive", exact=True).click()
    page.goto(console_server.base_url + "/event-log")
    times = page.locator("main table time").evaluate_all("els => els.map(e => e.dateTime)")
    assert len(times) >= 2 and times == sorted(times, reverse=True)


def test_a_reader_sees_no_re_import_and_its_posts_are_refused(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    kept = make_failed_import(failed_headers("order-1"), b"{}", queue="error", reason="no FailedQ")
    FailedMessageBatchWriter(engine).write(IngestionBatch(failed_imports=[kept]))
    configured = settings.model_copy(update={"auth_tokens": TOKENS})
    with TestClient(create_app(configured, engine, body_store), follow_redirects=False) as client:
        client.post("/signin", data={"token": READER})
        page = client.get("/failed-imports")
        assert page.status_code == 200 and "no FailedQ" in page.text
        assert "/reimport" not in page.text
        token = csrf_of(page.text)
        for path in ["/failed-imports/reimport-all", f"/failed-imports/{kept.id}/reimport"]:
            refused = client.post(path, data={"csrf_token": token})
            assert refused.status_code == 403 and "reader" in refused.text, path
            assert client.post(path, data={}).status_code == 403, path
        with engine.connect() as conn:
            assert count_failed_imports(conn) == 1
