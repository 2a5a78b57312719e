"""ServiceControl routes ServicePulse calls that Controlroom once answered 404, on every
provider: their exact status, shapes and headers (docs/decisions.md "ServicePulse's
requests are answered as ServiceControl answers them")."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import AuthToken, Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt
from tests.factories import at
from tests.nsb import failed_headers


def ingest(writer: FailedMessageBatchWriter, message_id: str, endpoint: str) -> FailedAttempt:
    attempt = parse_failed_message(
        failed_headers(message_id, endpoint=endpoint, failed_at=at(0)),
        b"{}",
        max_body_size_to_store=102_400,
    )
    writer.write(IngestionBatch(attempts=[attempt], endpoints=list(attempt.endpoints)))
    return attempt


def test_remotes_are_an_empty_array_for_a_single_instance(client: TestClient) -> None:
    response = client.get("/api/configuration/remotes")
    assert response.status_code == 200
    assert response.json() == []
    assert response.headers["X-Particular-Version"]


def test_endpoint_settings_have_the_default_entry(client: TestClient) -> None:
    response = client.get("/api/endpointssettings")
    assert response.status_code == 200
    assert response.json() == [{"name": "", "track_instances": True}]


def test_authentication_configuration_says_auth_is_off_without_tokens(
    client: TestClient,
) -> None:
    response = client.get("/api/authentication/configuration")
    assert response.status_code == 200
    assert response.json() == {"enabled": False}


def test_authentication_configuration_says_auth_is_on_and_needs_no_token(
    tmp_path: Path, database_url: str, engine: sa.Engine
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        auth_tokens=[AuthToken(name="pulse", token="a-reader-token-0123456789", role="reader")],
    )
    app = create_app(settings, engine, FileSystemBodyStore(tmp_path / "bodies"))
    with TestClient(app) as client:
        response = client.get("/api/authentication/configuration")  # no token: a client
        # asks this before it can know how to sign in
        assert client.get("/api/errors").status_code == 401
    assert response.status_code == 200
    assert response.json() == {"enabled": True}


def test_license_details_is_the_license(client: TestClient) -> None:
    details = client.get("/api/license/details")
    assert details.status_code == 200
    assert details.json() == client.get("/api/license").json()
    assert details.json()["license_status"] == "Valid"


def test_endpoints_lists_the_endpoints_known_from_failures(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    ingest(writer, "m1", "Sales")
    response = client.get("/api/endpoints")
    assert response.status_code == 200
    assert response.headers["Total-Count"] == "2"
    views = {view["name"]: view for view in response.json()}
    assert set(views) == {"Sales", "WebShop"}  # receiving and sending endpoints
    sales = views["Sales"]
    assert set(sales) == {
        "id",
        "name",
        "host_display_name",
        "monitored",
        "monitor_heartbeat",
        "is_sending_heartbeats",
    }
    assert sales["host_display_name"] == "MACHINENAME"
    assert sales["monitored"] is False and sales["monitor_heartbeat"] is False
    assert sales["is_sending_heartbeats"] is False


def test_patch_takes_service_controls_monitor_heartbeat(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    ingest(writer, "m1", "Sales")
    sales = next(v for v in client.get("/api/endpoints").json() if v["name"] == "Sales")

    response = client.patch(f"/api/endpoints/{sales['id']}", json={"monitor_heartbeat": True})

    assert response.status_code == 202
    after = next(v for v in client.get("/api/endpoints").json() if v["name"] == "Sales")
    assert after["monitored"] is True and after["monitor_heartbeat"] is True
    client.patch(f"/api/endpoints/{sales['id']}", json={"monitor_heartbeat": False})
    after = next(v for v in client.get("/api/endpoints").json() if v["name"] == "Sales")
    assert after["monitored"] is False


def test_the_version_header_is_the_servicecontrol_whose_behaviour_is_implemented(
    client: TestClient,
) -> None:
    # 6.15: the exception classifier's "No stacktrace" titles and localized frames.
    assert client.get("/api/").headers["X-Particular-Version"] == "6.15.0"
