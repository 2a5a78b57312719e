"""docs/decisions.md "Browsers cannot act through the API without consent", without a
browser: which requests the cross-site and Host guards refuse."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.api.guard import HostGuard
from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore

CONSOLE = "https://pulse.example:9090"


@pytest.fixture
def guarded(tmp_path: Path, database_url: str, engine: sa.Engine) -> TestClient:
    settings = Settings(
        data_dir=tmp_path / "data", database_url=database_url, cors_allowed_origins=[CONSOLE]
    )
    return TestClient(create_app(settings, engine, FileSystemBodyStore(tmp_path / "b")))


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
        {"Origin": "http://localhost:9999", "Sec-Fetch-Site": "same-site"},
        {"Origin": "https://evil.example"},  # a browser without fetch metadata
        {"Origin": "null", "Sec-Fetch-Site": "cross-site"},  # a sandboxed page
    ],
)
def test_a_state_changing_request_from_another_site_is_refused(
    guarded: TestClient, headers: dict[str, str]
) -> None:
    response = guarded.post("/api/errors/retry/all", headers=headers)

    assert response.status_code == 403
    assert "cors_allowed_origins" in response.json()["detail"]


@pytest.mark.parametrize(
    "headers",
    [
        {},  # curl, scripts, ServiceControl clients
        {"Sec-Fetch-Site": "same-origin", "Origin": "http://testserver"},
        {"Sec-Fetch-Site": "none"},  # typed by the user
        {"Origin": "http://testserver"},
        {"Origin": CONSOLE, "Sec-Fetch-Site": "cross-site"},  # the configured console
    ],
)
def test_same_origin_non_browser_and_configured_console_requests_pass(
    guarded: TestClient, headers: dict[str, str]
) -> None:
    response = guarded.post("/api/errors/retry/all", headers=headers)

    assert response.status_code == 202, response.text


def test_reads_from_another_site_are_not_refused_here(guarded: TestClient) -> None:
    # CORS keeps their answers from the page; refusing them would break nothing more.
    response = guarded.get("/api/errors", headers={"Sec-Fetch-Site": "cross-site"})
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("bound", "host", "allowed"),
    [
        ("127.0.0.1", "127.0.0.1:8080", True),
        ("127.0.0.1", "localhost:8080", True),
        ("127.0.0.1", "[::1]:8080", True),
        ("127.0.0.1", "localhost", True),
        ("127.0.0.1", "localhost:9999", False),
        ("127.0.0.1", "attacker.example:8080", False),
        ("127.0.0.1", "ops.internal", True),  # configured
        ("127.0.0.1", "", False),
        ("127.0.0.1", "localhost:80x", False),
        ("0.0.0.0", "10.1.2.3:8080", True),
        ("0.0.0.0", "attacker.example:8080", False),
        ("10.1.2.3", "10.1.2.3:8080", True),
        ("::1", "[::1]:8080", True),
        # Breaker pass (third): a configured IPv6 address written another way was a 421.
        ("127.0.0.1", "[fd00:0::5]", True),
        ("127.0.0.1", "[FD00::5]:443", True),
        ("127.0.0.1", "[fd00::6]", False),
    ],
)
def test_host_check(bound: str, host: str, allowed: bool) -> None:
    guard = HostGuard(
        lambda *a: None,  # type: ignore[arg-type,return-value]
        bound_host=bound,
        port=8080,
        allowed_hosts=["ops.internal", "[fd00::5]"],
    )
    assert guard.allows(host) is allowed
