"""``GET /api/health``: 200 when every part answers, 503 naming the part that does not."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.api import database_check, health
from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import make_failed_import
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.transport import TransportError


async def healthy() -> None:
    return None


async def broker_down() -> None:
    raise TransportError("connection refused by 127.0.0.1:5672")


def test_health_checks_the_database_by_default(client: TestClient) -> None:
    response = client.get("/api/health")

    assert response.status_code == 200
    assert response.json() == {"database": "ok", "details": {"failed_imports": 0}}


def test_health_is_200_when_database_and_broker_answer(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    checks = {"database": database_check(engine), "broker": healthy}
    with TestClient(create_app(settings, engine, body_store, health_checks=checks)) as client:
        response = client.get("/api/health")

    assert response.status_code == 200
    assert response.json() == {"database": "ok", "broker": "ok", "details": {"failed_imports": 0}}


def test_health_is_503_naming_the_failing_broker(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    checks = {"database": database_check(engine), "broker": broker_down}
    with TestClient(create_app(settings, engine, body_store, health_checks=checks)) as client:
        response = client.get("/api/health")

    assert response.status_code == 503
    states = response.json()
    assert states["database"] == "ok"
    assert states["broker"] == "failing: TransportError"


def test_health_is_503_naming_an_unreachable_database(
    settings: Settings, body_store: FileSystemBodyStore
) -> None:
    unreachable = create_store_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    try:
        app = create_app(settings, unreachable, body_store)
        with TestClient(app) as client:
            response = client.get("/api/health")
    finally:
        unreachable.dispose()

    assert response.status_code == 503
    assert response.json()["database"] == "failing: OperationalError"
    # Open route: the driver's text (host, port, user) goes to the log, not the answer.
    assert "127.0.0.1" not in response.text and "nobody" not in response.text


def test_health_counts_a_hung_check_as_failing(
    settings: Settings,
    engine: sa.Engine,
    body_store: FileSystemBodyStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(health, "CHECK_TIMEOUT_SECONDS", 0.2)

    async def hangs() -> None:
        await asyncio.sleep(60)

    checks = {"database": database_check(engine), "broker": hangs}
    with TestClient(create_app(settings, engine, body_store, health_checks=checks)) as client:
        response = client.get("/api/health")

    assert response.status_code == 503
    assert response.json()["broker"] == "failing: no answer within 0.2 s"


def test_health_details_count_failed_imports(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    broken = make_failed_import({"x": "y"}, b"z", queue="error", reason="no FailedQ")
    writer.write(IngestionBatch(failed_imports=[broken]))

    assert client.get("/api/health").json()["details"] == {"failed_imports": 1}
