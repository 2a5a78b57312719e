"""Bytes on the wire: compressed answers (JSON, HTML, CSS, JS above about a kilobyte, as
the client asks), the CSRF token masked in every answer that carries it (BREACH), static
files under content-hashed names cached for good, and a warm console page load that is
one small request in Chromium."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from controlroom.demo import generate_demo_messages
from controlroom.web.assets import HASH_DIGITS, IMMUTABLE
from controlroom.web.session import COOKIE_NAME
from tests.web.conftest import ConsoleServer
from tests.web.test_console_http import csrf_of, status_of

GZIP = {"Accept-Encoding": "gzip"}
STATIC_URL = re.compile(r'(?:href|src)="(/static/[^"]+)"')
WARM_PAGE_LIMIT = 15 * 1024


def raw_get(client: TestClient, path: str, headers: dict[str, str]) -> tuple[httpx.Response, bytes]:
    """The answer to ``GET path`` and its body as sent, still encoded."""
    with client.stream("GET", path, headers=headers) as response:
        return response, b"".join(response.iter_raw())


def session_csrf_token(client: TestClient) -> str:
    """The CSRF token the session cookie holds (its payload: base64url JSON, field c)."""
    payload = client.cookies[COOKIE_NAME].split(".")[0]
    token: str = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["c"]
    return token


# --- compression --------------------------------------------------------------------------
def test_a_json_list_is_gzipped_when_the_client_asks(console: TestClient, store: Any) -> None:
    for n in range(20):
        store(f"order-{n}", b'{"sku": "fig"}')
    plain, plain_body = raw_get(console, "/api/errors", {"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    gzipped, gzipped_body = raw_get(console, "/api/errors", GZIP)
    assert gzipped.headers["content-encoding"] == "gzip"
    assert "Accept-Encoding" in gzipped.headers["vary"]
    assert gzip.decompress(gzipped_body) == plain_body
    assert len(gzipped_body) < len(plain_body) / 4
    assert gzipped.headers["total-count"] == "20"  # the paging headers are left as they were


@pytest.mark.parametrize("encoding", ["br", "zstd"])
def test_br_and_zstd_are_served_to_a_client_that_asks(
    console: TestClient, store: Any, encoding: str
) -> None:
    for n in range(20):
        store(f"order-{n}", b'{"sku": "fig"}')
    answer = console.get("/api/errors", headers={"Accept-Encoding": encoding})
    assert answer.headers["content-encoding"] == encoding
    assert len(answer.json()) == 20  # httpx decodes both


def test_an_answer_under_a_kilobyte_is_not_compressed(console: TestClient) -> None:
    small, body = raw_get(console, "/api/license", GZIP)
    assert small.status_code == 200 and len(body) < 1024
    assert "content-encoding" not in small.headers


def test_a_console_page_is_gzipped_and_its_csrf_token_differs_in_every_answer(
    console: TestClient, store: Any, engine: Any
) -> None:
    ids = [store(f"order-{n}", b'{"sku": "fig"}') for n in range(3)]
    first, first_body = raw_get(console, "/messages", GZIP)
    assert first.headers["content-encoding"] == "gzip"
    page = gzip.decompress(first_body).decode()
    again = console.get("/messages", headers=GZIP).text
    tokens = [csrf_of(page), csrf_of(again)]
    assert tokens[0] != tokens[1]
    unmasked = session_csrf_token(console)
    assert unmasked not in page + again  # pages carry it masked only
    for token, message_id in zip(tokens, ids[:2], strict=True):
        done = console.post(f"/messages/{message_id}/archive", data={"csrf_token": token})
        assert done.status_code == 303
    refused = console.post(f"/messages/{ids[2]}/archive", data={"csrf_token": unmasked})
    assert refused.status_code == 403
    assert status_of(engine, ids[2]).name == "UNRESOLVED"


# --- static files -------------------------------------------------------------------------
def test_static_files_are_linked_by_content_hash_and_cached_for_good(
    console: TestClient,
) -> None:
    urls = set(STATIC_URL.findall(console.get("/messages").text))
    urls |= set(STATIC_URL.findall(console.get("/docs").text))
    names = {url.rsplit("/", 1)[1].split(".")[0] for url in urls}
    assert {"console", "htmx", "favicon", "swagger-ui", "swagger-ui-bundle", "docs"} <= names
    for url in urls:
        answer, body = raw_get(console, url, {"Accept-Encoding": "identity"})
        assert answer.status_code == 200, url
        assert answer.headers["cache-control"] == IMMUTABLE, url
        digest = hashlib.sha256(body).hexdigest()[:HASH_DIGITS]
        assert url.split(".")[-2] == digest, url
    # The old names keep answering, without the promise.
    unhashed = console.get("/static/console.css")
    assert unhashed.status_code == 200 and "immutable" not in unhashed.headers.get(
        "cache-control", ""
    )
    assert console.get("/static/console.00000000.css").status_code == 404


def test_javascript_and_css_are_compressed_too(console: TestClient) -> None:
    page = console.get("/messages").text
    for url in STATIC_URL.findall(page):
        if url.endswith((".js", ".css")):
            answer, _ = raw_get(console, url, GZIP)
            assert answer.headers["content-encoding"] == "gzip", url
            assert answer.headers["cache-control"] == IMMUTABLE, url


def test_every_page_links_the_favicon(console: TestClient) -> None:
    page = console.get("/messages").text
    [icon] = re.findall(r'<link rel="icon" type="image/svg\+xml" href="([^"]+)"', page)
    answer = console.get(icon)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("image/svg+xml")


# --- in the browser -----------------------------------------------------------------------
def test_a_warm_messages_page_load_is_one_small_request(
    chromium: Any, console_server: ConsoleServer
) -> None:
    now = datetime.now(UTC)
    for message in generate_demo_messages(80, seed=7, now=now):
        console_server.publish(message.headers, message.body)
    console_server.wait_until_stored(50)  # a full page
    # A context of its own: the fixture's loopback fence routes every request, and
    # Playwright turns Chromium's HTTP cache off on a routed context. The CSP keeps this
    # page on 127.0.0.1 anyway, and the assertion below sees every request it makes.
    context = chromium.new_context()
    try:
        page = context.new_page()
        url = console_server.base_url + "/messages"
        page.goto(url)
        page.wait_for_load_state("networkidle")
        cold = [exchange.path for exchange in console_server.exchanges]
        assert any(path.startswith("/static/") for path in cold)
        console_server.exchanges.clear()
        page.goto(url)
        page.wait_for_load_state("networkidle")
        assert [exchange.path for exchange in console_server.exchanges] == ["/messages"]
        [warm] = console_server.exchanges
        sent = warm.header_bytes + warm.body_bytes
        assert sent <= WARM_PAGE_LIMIT, f"{sent} bytes"
        assert page.locator("table tbody tr").count() >= 50
    finally:
        context.close()
