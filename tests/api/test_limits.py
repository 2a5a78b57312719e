"""docs/decisions.md "Request bodies are bounded and authenticated before they are read": bodies
over the limit are refused before they are read, auth comes before parsing, and a 422 never echoes
the input."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore

LIMIT = 64 * 1024
TOKEN = "operator-token-0123456789"


@pytest.fixture
def limited_app(tmp_path: Path, database_url: str, engine: sa.Engine) -> FastAPI:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        max_request_body_size=LIMIT,
        auth_tokens=[{"name": "ops", "token": TOKEN, "role": "operator"}],
    )
    return create_app(settings, engine, FileSystemBodyStore(tmp_path / "b"))


@pytest.fixture
def limited(limited_app: FastAPI) -> Iterator[TestClient]:
    with TestClient(limited_app) as client:
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


def test_a_body_without_a_token_is_refused_before_a_byte_of_it_is_read(
    limited_app: FastAPI,
) -> None:
    pulled = 0

    async def counting(scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            nonlocal pulled
            message = await receive()
            pulled += len(message.get("body", b""))
            return message

        await limited_app(scope, counted, send)

    with TestClient(counting) as client:
        response = client.patch("/api/errors/archive", content=b"[" + b" " * (LIMIT // 2) + b"]")

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert pulled == 0


def test_a_422_names_the_field_without_echoing_the_input(limited: TestClient) -> None:
    secret = "a-value-that-must-not-come-back-" * 10
    response = limited.patch("/api/errors/archive", json=[secret], headers=AUTH)

    assert response.status_code == 422
    assert secret[:32] not in response.text
    assert response.json()["detail"][0]["loc"][0] == "body"
