"""``GET /api/configuration`` on every provider: effective settings, no secrets."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.api.configuration import dotnet_timespan
from controlroom.app import create_app
from controlroom.config import AuthToken, IngestionSettings, Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore

TOKEN = "a-very-secret-token-0123456789"
BROKER_PASSWORD = "broker-pass-s3cret"


@pytest.mark.parametrize(
    ("span", "text"),
    [
        (timedelta(days=15), "15.00:00:00"),
        (timedelta(hours=1, minutes=30), "01:30:00"),
        (timedelta(days=1, seconds=5, microseconds=500_000), "1.00:00:05.5000000"),
        (timedelta(0), "00:00:00"),
        (timedelta(days=400, hours=23, minutes=59, seconds=59), "400.23:59:59"),
        (-timedelta(hours=2), "-02:00:00"),
    ],
)
def test_dotnet_timespan(span: timedelta, text: str) -> None:
    assert dotnet_timespan(span) == text


def test_default_configuration(client: TestClient, settings: Settings) -> None:
    response = client.get("/api/configuration")
    assert response.status_code == 200
    body = response.json()
    assert body["data_retention"] == {"error_retention_period": "15.00:00:00"}
    assert body["performance_tunning"] == {"max_body_size_to_store": 102_400}
    assert body["ingestion"]["batch_size"] == 200
    assert body["ingestion"]["concurrent_batches"] == 2
    assert body["ingestion"]["prefetch"] == 400
    assert body["transport"] == {"transport_type": "Embedded", "error_queue": "error"}
    assert body["host"]["authentication_enabled"] is False
    assert (
        body["host"]["database_provider"] == sa.make_url(settings.database_url).get_backend_name()
    )


def test_configuration_shows_effective_values_and_no_secret(
    tmp_path: Path, database_url: str, engine: sa.Engine
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        broker_url=f"amqp://ops:{BROKER_PASSWORD}@rabbit.internal:5672/",
        error_retention_period=timedelta(days=7, hours=12),
        max_body_size_to_store=4096,
        ingestion=IngestionSettings(batch_size=50, concurrent_batches=4),
        auth_tokens=[AuthToken(name="ops", token=TOKEN, role="reader")],
    )
    app = create_app(settings, engine, FileSystemBodyStore(tmp_path / "bodies"))
    with TestClient(app) as client:
        response = client.get("/api/configuration", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    body = response.json()
    assert body["data_retention"]["error_retention_period"] == "7.12:00:00"
    assert body["performance_tunning"]["max_body_size_to_store"] == 4096
    assert body["ingestion"]["batch_size"] == 50
    assert body["ingestion"]["prefetch"] == 200
    assert body["transport"]["transport_type"] == "RabbitMQ"
    assert body["host"]["authentication_enabled"] is True
    secrets = [TOKEN, BROKER_PASSWORD, "rabbit.internal"]
    if engine.url.password:
        secrets.append(str(engine.url.password))
    for secret in secrets:
        assert secret not in response.text
    assert "postgresql://" not in response.text and "sqlite://" not in response.text
