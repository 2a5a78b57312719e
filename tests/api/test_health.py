"""``GET /api/health``: 200 when every part answers, 503 naming the part that does not."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.api import database_check, health
from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
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


def autovacuum_off(engine: sa.Engine) -> bool:
    """The store is PostgreSQL and ``SHOW autovacuum`` says off (this machine's server)."""
    if engine.dialect.name != "postgresql":
        return False
    with engine.connect() as conn:
        return conn.exec_driver_sql("SHOW autovacuum").scalar_one() == "off"


def without_vacuum_warnings(answer: dict[str, Any], engine: sa.Engine) -> dict[str, Any]:
    """``answer`` without its ``warnings``, after checking that they are exactly the one
    the store's autovacuum setting calls for (none where it is on, or on SQLite)."""
    warnings = answer.pop("warnings", [])
    if autovacuum_off(engine):
        assert len(warnings) == 1 and "autovacuum is off" in warnings[0]
    else:
        assert warnings == []
    return answer


def test_health_checks_the_database_by_default(client: TestClient, engine: sa.Engine) -> None:
    response = client.get("/api/health")

    assert response.status_code == 200
    answer = without_vacuum_warnings(response.json(), engine)
    assert answer == {"database": "ok", "details": {"failed_imports": 0}}


def test_health_is_200_when_database_and_broker_answer(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    checks = {"database": database_check(engine), "broker": healthy}
    with TestClient(create_app(settings, engine, body_store, health_checks=checks)) as client:
        response = client.get("/api/health")

    assert response.status_code == 200
    answer = without_vacuum_warnings(response.json(), engine)
    assert answer == {"database": "ok", "broker": "ok", "details": {"failed_imports": 0}}


def test_health_warns_when_the_stores_autovacuum_is_off_saying_what_it_costs(
    client: TestClient, engine: sa.Engine
) -> None:
    # The server's setting cannot change from a test: the warning follows it, whichever.
    response = client.get("/api/health")

    assert response.status_code == 200
    warnings = response.json().get("warnings", [])
    vacuum = [w for w in warnings if "autovacuum is off" in w]
    assert bool(vacuum) == autovacuum_off(engine)
    for warning in vacuum:
        assert "dead rows" in warning and "failed_message_group_counts" in warning
        assert "slower" in warning


def test_health_warns_of_a_counter_table_whose_autovacuum_is_disabled(
    postgresql_url: str, tmp_path: Path
) -> None:
    engine = create_store_engine(postgresql_url)
    try:
        upgrade_database(engine)
        settings = Settings(data_dir=tmp_path / "data", database_url=postgresql_url)
        body_store = FileSystemBodyStore(settings.body_dir)
        with TestClient(create_app(settings, engine, body_store)) as client:
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    "ALTER TABLE failed_message_tally_deltas SET (autovacuum_enabled = off)"
                )
            disabled = client.get("/api/health")
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    "ALTER TABLE failed_message_tally_deltas RESET (autovacuum_enabled)"
                )
            reset = client.get("/api/health")
    finally:
        engine.dispose()

    assert disabled.status_code == 200
    named = [w for w in disabled.json()["warnings"] if "failed_message_tally_deltas (" in w]
    assert len(named) == 1 and "autovacuum is disabled for table" in named[0]
    assert not any("autovacuum is disabled" in w for w in reset.json().get("warnings", []))


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
