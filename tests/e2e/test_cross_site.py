"""docs/decisions.md "Browsers cannot act through the API without consent", in headless
Chromium: a page on another origin must not change anything
through the open loopback API (no-cors ``fetch``, form posts), a configured console
origin keeps working, and a foreign ``Host`` (DNS rebinding) is refused.

Needs Playwright and Debian's chromium (``/usr/bin/chromium``); skips saying why without.
"""

from __future__ import annotations

import contextlib
import http.server
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
import uvicorn

from controlroom.api.guard import HostGuard
from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_group_comments,
    failed_messages,
)
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from tests.api.failure_fixture import ingest_fixture
from tests.servers import TEST_CLIENT_TIMEOUT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
playwright_sync = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason="Debian chromium is not installed (apt-get install chromium)",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def serving_api(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> Iterator[str]:
    """The API as ``controlroom serve`` runs it (Host check included), on a free port."""
    app = HostGuard(
        create_app(settings, engine, body_store),
        bound_host=settings.host,
        port=settings.port,
        allowed_hosts=settings.allowed_hosts,
    )
    server = uvicorn.Server(
        uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the API did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{settings.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextlib.contextmanager
def serving_page(html: str, port: int = 0) -> Iterator[str]:
    """A page on another origin (``localhost`` at another port: another site than
    ``127.0.0.1``)."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()


def hostile_page(api: str, ids: list[str], group_id: str) -> str:
    return f"""<!doctype html><html><body>
<form id="f" method="POST" target="sink"
      action="{api}/api/recoverability/groups/{group_id}/comment?comment=pwned"></form>
<iframe name="sink"></iframe>
<script>
  const api = {api!r};
  const ids = {ids!r};
  const sent = [
    fetch(api + "/api/errors/archive", {{method: "POST", mode: "no-cors",
      headers: {{"Content-Type": "text/plain"}}, body: JSON.stringify(ids)}}),
    fetch(api + "/api/errors/retry/all", {{method: "POST", mode: "no-cors"}}),
    fetch(api + "/api/recoverability/groups/{group_id}/comment?comment=pwned",
      {{method: "POST", mode: "no-cors"}}),
  ];
  document.getElementById("f").submit();
  Promise.allSettled(sent).then(() => {{ document.title = "done"; }});
</script></body></html>"""


def console_page(api: str, ids: list[str]) -> str:
    """What ServicePulse does: JSON with Content-Type application/json (a preflight)."""
    return f"""<!doctype html><html><body><script>
  fetch({api!r} + "/api/errors/archive", {{method: "PATCH",
    headers: {{"Content-Type": "application/json"}}, body: JSON.stringify({ids!r})}})
    .then(r => {{ document.title = "status " + r.status; }},
          e => {{ document.title = "error " + e; }});
</script></body></html>"""


def statuses(engine: sa.Engine) -> set[int]:
    with engine.connect() as conn:
        return set(conn.scalars(sa.select(failed_messages.c.status)))


def comments(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        query = sa.select(sa.func.count()).select_from(failed_message_group_comments)
        return conn.execute(query).scalar_one()


def open_in_chromium(url: str, wait_title: str) -> str:
    with playwright_sync.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            page = browser.new_page()
            page.goto(url)
            page.wait_for_function(f"document.title.startsWith({wait_title!r})", timeout=30_000)
            page.wait_for_timeout(500)  # let the form post land, too
            return page.title()
        finally:
            browser.close()


def test_a_page_on_another_origin_changes_nothing_and_a_console_origin_works(
    tmp_path: Path, database_url: str, engine: sa.Engine, writer: FailedMessageBatchWriter
) -> None:
    ids = sorted(ingest_fixture(writer))
    body_store = FileSystemBodyStore(tmp_path / "bodies")
    port = free_port()
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url, port=port)
    with serving_api(settings, engine, body_store) as api:
        group_id = httpx.get(
            f"{api}/api/recoverability/groups", timeout=TEST_CLIENT_TIMEOUT
        ).json()[0]["id"]
        with serving_page(hostile_page(api, ids, group_id)) as page:
            open_in_chromium(page, "done")

        assert statuses(engine) == {int(FailedMessageStatus.UNRESOLVED)}
        assert comments(engine) == 0

        rebound = httpx.get(
            f"{api}/api/errors",
            headers={"Host": f"attacker.example:{port}"},
            timeout=TEST_CLIENT_TIMEOUT,
        )
        assert rebound.status_code == 421
        assert (
            httpx.get(
                f"http://localhost:{port}/api/errors", timeout=TEST_CLIENT_TIMEOUT
            ).status_code
            == 200
        )

    # A trusted console on another origin (cors_allowed_origins) still archives, sending
    # JSON as ServicePulse does (a CORS preflight, then the PATCH).
    page_port, api_port = free_port(), free_port()
    origin = f"http://localhost:{page_port}"
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        port=api_port,
        cors_allowed_origins=[origin],
    )
    with (
        serving_api(settings, engine, body_store) as api,
        serving_page(console_page(api, ids[:2]), page_port) as page,
    ):
        assert open_in_chromium(page, "status") == "status 202"
    assert int(FailedMessageStatus.ARCHIVED) in statuses(engine)
