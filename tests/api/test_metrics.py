"""docs/decisions.md "Metrics are labelled by route template": ``GET /metrics`` serves the process's
counters, with HTTP requests labelled by route template (low cardinality), per provider."""

from __future__ import annotations

import re
import uuid

import sqlalchemy as sa
from fastapi.testclient import TestClient

# Importing them registers their metrics, as serve does.
import controlroom.errors.ingest.pipeline
import controlroom.errors.retention
import controlroom.errors.retries.processor  # noqa: F401
from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.kpi_history import METRICS
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from tests.api.test_health import with_troubled_sites
from tests.reconciliation.harness import as_site
from tests.sitecalls.packets import packet


def test_metrics_are_served_with_route_templates_not_paths(client: TestClient) -> None:
    for _ in range(2):
        assert client.get(f"/api/errors/{uuid.uuid4()}").status_code == 404
    assert client.get("/api/errors").status_code == 200
    assert client.get("/no/such/page").status_code == 404

    response = client.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for name in (
        "controlroom_ingested_messages_total",
        "controlroom_ingestion_batch_seconds",
        "controlroom_retried_messages_total",
        "controlroom_retention_deleted_total",
        "controlroom_http_requests_total",
    ):
        assert f"# HELP {name}" in text
    assert 'route="/api/errors",status="200"' in text
    assert 'route="/api/errors/{id}",status="404"' in text
    assert 'route="unmatched",status="404"' in text
    assert "/api/errors/0" not in text and "/no/such/page" not in text


def test_site_states_and_every_site_call_kpi_are_gauges(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    configured = with_troubled_sites(settings, engine)
    with TestClient(create_app(configured, engine, body_store)) as client:
        posted = client.post(
            "/api/site-calls/telemetry",
            json=[packet("Parked", op_id=str(uuid.uuid4()), source_site="plant-7")],
            headers=as_site("plant-7"),
        )
        assert posted.status_code == 200, posted.text
        assert posted.json()["accepted"] == [0]
        text = client.get("/metrics").text

    assert 'controlroom_site_pinned{site="plant-7"} 1.0' in text
    assert 'controlroom_site_reachable{site="plant-9"} 0.0' in text
    assert 'controlroom_site_reachable{site="plant-11"} 1.0' in text
    lag = re.search(r'controlroom_site_reconciliation_lag_seconds\{site="plant-7"\} (\S+)', text)
    assert lag is not None and float(lag.group(1)) >= 7200
    assert 'controlroom_site_reconciliation_lag_seconds{site="plant-9"}' not in text
    for metric in METRICS:
        assert f"# HELP controlroom_sitecalls_{metric}" in text
    assert 'controlroom_sitecalls_parked{site="plant-7"} 1.0' in text
    assert 'controlroom_sitecalls_buffered{site="plant-9"} 0.0' in text
