"""``GET /api/health``: 200 when every part answers, 503 naming the part that does not."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.api import database_check, health
from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.tables import site_reconciliation
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import make_failed_import
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.transport import TransportError
from tests.reconciliation.harness import site_entry


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


def test_what_is_wrong_with_a_site_is_a_warning_and_health_stays_200(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    configured = with_troubled_sites(settings, engine)
    with TestClient(create_app(configured, engine, body_store)) as client:
        response = client.get("/api/health")

    assert response.status_code == 200
    answer = response.json()
    assert answer["database"] == "ok"
    sites = answer["details"]["sites"]
    assert sites["plant-7"]["pinned"] is True and sites["plant-7"]["reachable"] is True
    assert sites["plant-7"]["reconciliation_lag_seconds"] >= 7200
    assert sites["plant-9"] == {
        "reachable": False,
        "pinned": False,
        "reconciliation_lag_seconds": None,
    }
    assert sites["plant-11"]["pinned"] is False
    assert sites["plant-11"]["reconciliation_lag_seconds"] < 300
    warnings = answer["warnings"]
    assert any("plant-7 is pinned" in w for w in warnings)
    assert any("plant-7 has not been reconciled for" in w for w in warnings)
    assert any("plant-9 is unreachable" in w for w in warnings)
    assert any("plant-9 has never been reconciled" in w for w in warnings)
    assert not any("plant-11" in w for w in warnings)
    assert "127.0.0.1" not in response.text  # no address on the open endpoint


def with_troubled_sites(settings: Settings, engine: sa.Engine) -> Settings:
    """Three configured sites: plant-7 pinned and two hours behind, plant-9 never
    reached, plant-11 fine."""
    now = datetime.now(UTC)
    rows = [
        ("plant-7", now - timedelta(hours=2), True, True, None),
        ("plant-9", None, False, False, "site plant-9 unreachable: ConnectError"),
        ("plant-11", now - timedelta(seconds=30), True, False, None),
    ]
    with engine.begin() as conn:
        conn.execute(
            sa.insert(site_reconciliation),
            [
                {
                    "site_id": site,
                    "last_pull_at_utc": now - timedelta(seconds=20),
                    "last_success_at_utc": success,
                    "reachable": reachable,
                    "pinned": pinned,
                    "last_error": error,
                    "rows_pulled": 0,
                }
                for site, success, reachable, pinned, error in rows
            ],
        )
    sites = [site_entry(site, f"http://127.0.0.1:{9 + n}") for n, (site, *_) in enumerate(rows)]
    return settings.model_copy(update={"sites": sites})
