"""A rejected packet of any size is listed by a bounded preview and downloaded whole, on
every provider (API and console); the queue path refuses a packet larger than a request
may be, naming the size, as the HTTP path does."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.sitecalls.intake import make_writer, receive_bytes
from tests.sitecalls.packets import packet

BIG = 3 * 1024 * 1024
PREVIEW_BOUND = 64 * 1024  # a page's answer stays this small whatever a packet's size


@pytest.fixture
def app_client(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> Iterator[TestClient]:
    with TestClient(create_app(settings, engine, body_store), follow_redirects=False) as client:
        yield client


def keep_a_big_packet(settings: Settings, engine: sa.Engine) -> bytes:
    """A packet the contract refuses (an unknown field) of ``BIG`` bytes, kept whole."""
    data = packet("Delivered", padding="é" * (BIG // 2))
    raw = json.dumps(data, ensure_ascii=False).encode()
    (reason,) = make_writer(settings, engine).write([receive_bytes(raw, "site-call-telemetry")])
    assert reason is not None
    return raw


def test_the_api_lists_a_preview_and_downloads_the_packet_whole(
    settings: Settings, engine: sa.Engine, app_client: TestClient
) -> None:
    raw = keep_a_big_packet(settings, engine)

    listed = app_client.get("/api/site-calls/rejected")
    assert listed.status_code == 200
    assert len(listed.content) < PREVIEW_BOUND
    (item,) = listed.json()["items"]
    assert item["packet_size"] == len(raw) and item["packet_truncated"] is True
    assert raw.decode().startswith(item["packet"].rstrip("\ufffd"))
    assert item["packet_url"] == f"/api/site-calls/rejected/{item['id']}/packet"

    whole = app_client.get(item["packet_url"])
    assert whole.status_code == 200 and whole.content == raw
    assert whole.headers["content-type"] == "application/octet-stream"
    assert whole.headers["content-disposition"].startswith("attachment;")
    missing = f"/api/site-calls/rejected/{uuid.UUID(int=0)}/packet"
    assert app_client.get(missing).status_code == 404


def test_the_console_lists_a_preview_and_downloads_the_packet_whole(
    settings: Settings, engine: sa.Engine, app_client: TestClient
) -> None:
    raw = keep_a_big_packet(settings, engine)

    page = app_client.get("/site-calls/rejected")
    assert page.status_code == 200
    assert len(page.content) < PREVIEW_BOUND
    link = re.search(r'href="(/site-calls/rejected/[0-9a-f-]{36}/packet)"', page.text)
    assert link is not None, "the page links the whole packet"
    assert "3.0 MiB" in page.text  # its size, beside the preview
    whole = app_client.get(link.group(1))
    assert whole.status_code == 200 and whole.content == raw
    assert whole.headers["content-disposition"].startswith("attachment;")


def test_the_queue_path_refuses_a_packet_larger_than_a_request_may_be() -> None:
    raw = json.dumps(packet("Delivered")).encode()
    assert receive_bytes(raw, "q", max_bytes=len(raw)).packet is not None
    refused = receive_bytes(raw, "q", max_bytes=len(raw) - 1)
    assert refused.packet is None
    assert refused.rejected_because == (
        f"the packet is {len(raw)} bytes, more than the {len(raw) - 1} a packet may have "
        "(max_request_body_size)"
    )


@pytest.mark.parametrize("path", ["/api/site-calls/rejected", "/site-calls/rejected"])
def test_an_empty_packet_is_listed_like_any_other(
    settings: Settings, engine: sa.Engine, app_client: TestClient, path: str
) -> None:
    """Fresh-user pass (fifth): on SQLite an empty packet's preview was NULL (``substr`` of
    an empty blob), and the list answered 500 for every page holding it."""
    (reason,) = make_writer(settings, engine).write([receive_bytes(b"", "site-call-telemetry")])
    assert reason is not None

    listed = app_client.get(path)

    assert listed.status_code == 200, listed.text
    if path.startswith("/api"):
        (item,) = listed.json()["items"]
        assert (item["packet"], item["packet_size"], item["packet_truncated"]) == ("", 0, False)
