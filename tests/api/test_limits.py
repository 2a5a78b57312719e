"""Issue 14 item 7: bodies over the limit are refused before they are read, auth comes
before parsing, and a 422 never echoes the input."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.api import create_app
from controlroom.config import Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore

LIMIT = 64 * 1024
TOKEN = "operator-token-0123456789"


@pytest.fixture
def limited(tmp_path: Path, database_url: str, engine: sa.Engine) -> Iterator[TestClient]:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        max_request_body_size=LIMIT,
        auth_tokens=[{"name": "ops", "token": TOKEN, "role": "operator"}],
    )
    with TestClient(create_app(settings, engine, FileSystemBodyStore(tmp_path / "b"))) as client:
        yield client


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_a_body_over_the_limit_is_413_by_its_length(limited: TestClient) -> None:
    response = limited.patch(
        "/api/errors/archive", content=b"[" + b" " * LIMIT + b"]", headers=AUTH
    )

    assert response.status_code == 413
    assert "max_request_body_size" in response.json()["detail"]


def test_a_streamed_body_over_the_limit_is_413(limited: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b"["
        for _ in range(LIMIT // 1024 + 1):
            yield b" " * 1024
        yield b"]"

    response = limited.patch("/api/errors/archive", content=chunks(), headers=AUTH)

    assert response.status_code == 413


def test_a_large_body_without_a_token_is_401_before_it_is_parsed(limited: TestClient) -> None:
    # Not even valid JSON: a parse before the auth check would make it a 422.
    response = limited.patch("/api/errors/archive", content=b"{not json" * 1000)

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_a_422_names_the_field_without_echoing_the_input(limited: TestClient) -> None:
    secret = "a-value-that-must-not-come-back-" * 10
    response = limited.patch("/api/errors/archive", json=[secret], headers=AUTH)

    assert response.status_code == 422
    assert secret[:32] not in response.text
    assert response.json()["detail"][0]["loc"][0] == "body"
