"""docs/decisions.md "Metrics are labelled by route template": ``GET /metrics`` serves the process's
counters, with HTTP requests labelled by route template (low cardinality), per provider."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

# Importing them registers their metrics, as serve does.
import controlroom.errors.ingest.pipeline
import controlroom.errors.retention
import controlroom.errors.retries.processor  # noqa: F401


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
