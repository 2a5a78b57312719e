"""Bearer-token auth on every provider: each role against each route class, 401/403,
the open embedded default, and the refusal to serve an open API beyond loopback."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from controlroom import cli
from controlroom.api.auth import ensure_serving_is_protected
from controlroom.app import create_app
from controlroom.config import AuthToken, Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.exceptions import ConfigurationError
from controlroom.runtime.addresses import is_loopback

UNKNOWN = "00000000-0000-4000-8000-000000000000"
TOKENS = {
    "reader": "reader-token-0123456789abcdef",
    "operator": "operator-token-0123456789abcdef",
    "admin": "admin-token-0123456789abcdef",
}

# (method, path, json body, status when allowed): one route per class, and more of each.
READ = [
    ("GET", "/api/errors", None, 200),
    ("GET", "/api/recoverability/groups", None, 200),
    ("GET", "/api/endpoints/known", None, 200),
    ("GET", "/api/configuration", None, 200),
    ("GET", f"/api/recoverability/groups/id/{UNKNOWN}", None, 404),
    ("GET", "/api/notifications", None, 200),
    ("GET", f"/api/notifications/{UNKNOWN}", None, 404),
]
OPERATE = [
    ("PATCH", "/api/errors/archive", [], 202),
    ("POST", f"/api/errors/{UNKNOWN}/archive", None, 404),
    ("PATCH", "/api/errors/unarchive", [], 202),
    ("PATCH", "/api/pendingretries/resolve", {"uniquemessageids": []}, 202),
    ("POST", f"/api/recoverability/groups/{UNKNOWN}/comment?comment=x", None, 404),
    ("POST", f"/api/recoverability/groups/{UNKNOWN}/errors/archive", None, 404),
    ("PATCH", f"/api/endpoints/{UNKNOWN}", {"monitoring_enabled": True}, 404),
    ("POST", f"/api/notifications/{UNKNOWN}/retry", None, 404),
    ("POST", f"/api/notifications/{UNKNOWN}/discard", None, 404),
]
ADMINISTER = [("DELETE", f"/api/endpoints/{UNKNOWN}", None, 404)]
ALLOWED_CLASSES = {
    "reader": {"read"},
    "operator": {"read", "operate"},
    "admin": {"read", "operate", "administer"},
}
CASES = [
    pytest.param(role, kind, *route, id=f"{role}-{route[0]}-{route[1]}")
    for role in TOKENS
    for kind, routes in (("read", READ), ("operate", OPERATE), ("administer", ADMINISTER))
    for route in routes
]


def make_app(tmp_path: Path, database_url: str, engine: sa.Engine, **overrides: Any) -> FastAPI:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url, **overrides)
    return create_app(settings, engine, FileSystemBodyStore(tmp_path / "bodies"))


@pytest.fixture
def secured(tmp_path: Path, database_url: str, engine: sa.Engine) -> Iterator[TestClient]:
    tokens = [
        AuthToken(name=f"{role}-user", token=token, role=role) for role, token in TOKENS.items()
    ]  # type: ignore[arg-type]
    with TestClient(make_app(tmp_path, database_url, engine, auth_tokens=tokens)) as client:
        yield client


def call(client: TestClient, method: str, path: str, body: Any, token: str | None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return client.request(method, path, json=body, headers=headers)


# --- each role against each route class ---------------------------------------------------
@pytest.mark.parametrize(("role", "kind", "method", "path", "body", "allowed"), CASES)
def test_role_against_route_class(
    secured: TestClient,
    role: str,
    kind: str,
    method: str,
    path: str,
    body: Any,
    allowed: int,
) -> None:
    response = call(secured, method, path, body, TOKENS[role])
    if kind in ALLOWED_CLASSES[role]:
        assert response.status_code == allowed, response.text
    else:
        assert response.status_code == 403, response.text
        assert f"{role}-user" in response.json()["detail"]
        assert TOKENS[role] not in response.text


@pytest.mark.parametrize(("method", "path", "body", "allowed"), READ + OPERATE + ADMINISTER)
def test_no_token_is_401_with_a_bearer_challenge(
    secured: TestClient, method: str, path: str, body: Any, allowed: int
) -> None:
    response = call(secured, method, path, body, None)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer not-a-configured-token-at-all",
        f"Bearer {TOKENS['admin'].upper()}",
        f"Bearer {TOKENS['admin'][:-1]}",
        f"Basic {TOKENS['admin']}",
        f"{TOKENS['admin']}",
        "Bearer ",
    ],
)
def test_bad_token_is_401(secured: TestClient, authorization: str) -> None:
    response = secured.get("/api/errors", headers={"Authorization": authorization})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert TOKENS["admin"] not in response.text


def test_scheme_is_case_insensitive(secured: TestClient) -> None:
    response = secured.get("/api/errors", headers={"Authorization": f"bearer {TOKENS['reader']}"})
    assert response.status_code == 200


def test_health_stays_open(secured: TestClient) -> None:
    assert secured.get("/api/health").status_code == 200


def test_a_route_added_later_is_covered(
    tmp_path: Path, database_url: str, engine: sa.Engine
) -> None:
    tokens = [AuthToken(name="r", token=TOKENS["reader"], role="reader")]
    app = make_app(tmp_path, database_url, engine, auth_tokens=tokens)

    @app.post("/api/later")
    def later() -> dict[str, bool]:
        return {"ok": True}

    with TestClient(app) as client:
        assert client.post("/api/later").status_code == 401
        assert call(client, "POST", "/api/later", None, TOKENS["reader"]).status_code == 403


# --- the open default ---------------------------------------------------------------------
@pytest.mark.parametrize(("method", "path", "body", "allowed"), READ + OPERATE + ADMINISTER)
def test_without_tokens_everything_is_open(
    tmp_path: Path,
    database_url: str,
    engine: sa.Engine,
    method: str,
    path: str,
    body: Any,
    allowed: int,
) -> None:
    with TestClient(make_app(tmp_path, database_url, engine)) as client:
        assert call(client, method, path, body, None).status_code == allowed


# --- refusing to serve an open API beyond loopback ----------------------------------------
@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost", "LOCALHOST"]
)
def test_loopback_without_tokens_may_serve(host: str) -> None:
    assert is_loopback(host)
    ensure_serving_is_protected(Settings(host=host))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "10.0.0.1", "ops.example.com"])
def test_non_loopback_without_tokens_is_refused(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(ConfigurationError) as refused:
        ensure_serving_is_protected(Settings(host=host))
    message = str(refused.value)
    assert "without authentication" in message
    assert "auth_tokens" in message and "CONTROLROOM_AUTH_TOKENS" in message
    assert "--host 127.0.0.1" in message


def test_non_loopback_with_tokens_may_serve() -> None:
    tokens = [AuthToken(name="ops", token=TOKENS["admin"], role="admin")]
    ensure_serving_is_protected(Settings(host="0.0.0.0", auth_tokens=tokens))


# --- token settings -----------------------------------------------------------------------
def test_tokens_from_the_environment_and_never_in_a_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "CONTROLROOM_AUTH_TOKENS",
        f'[{{"name": "ops", "token": "{TOKENS["operator"]}", "role": "operator"}}]',
    )
    settings = Settings()
    assert [(t.name, t.role) for t in settings.auth_tokens] == [("ops", "operator")]
    assert settings.auth_tokens[0].token.get_secret_value() == TOKENS["operator"]
    assert TOKENS["operator"] not in repr(settings) and TOKENS["operator"] not in str(settings)


@pytest.mark.parametrize(
    "tokens",
    [
        [{"name": "a", "token": "tiny-s3cret", "role": "admin"}],
        [{"name": "a", "token": TOKENS["admin"], "role": "root"}],
        [
            {"name": "a", "token": TOKENS["admin"], "role": "admin"},
            {"name": "b", "token": TOKENS["admin"], "role": "reader"},
        ],
        [
            {"name": "a", "token": TOKENS["admin"], "role": "admin"},
            {"name": "a", "token": TOKENS["reader"], "role": "reader"},
        ],
    ],
)
def test_bad_token_settings_are_refused_without_echoing_them(tokens: list[dict[str, str]]) -> None:
    with pytest.raises(ValueError) as refused:
        Settings(auth_tokens=tokens)  # type: ignore[arg-type]
    assert "auth_tokens" in str(refused.value)
    for entry in tokens:
        assert entry["token"] not in str(refused.value)


# --- serve refuses before starting anything -----------------------------------------------
def isolate_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("CONTROLROOM_"):
            monkeypatch.delenv(name)
    data_dir = tmp_path / "data"
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(data_dir))
    return data_dir


@pytest.mark.parametrize(
    ("host", "shown"),
    # Fresh-user pass (fourth): "::" was shown as ":::0", an address no one can read.
    [("0.0.0.0", "0.0.0.0:0"), ("::", "[::]:0"), ("[::]", "[::]:0")],
)
def test_serve_refuses_an_open_api_on_a_non_loopback_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str, shown: str
) -> None:
    data_dir = isolate_settings(tmp_path, monkeypatch)
    result = CliRunner().invoke(cli.app, ["serve", "--host", host, "--port", "0"])
    assert result.exit_code == 2
    assert f"refusing to serve on {shown} without authentication" in result.output
    assert "auth_tokens" in result.output
    assert not data_dir.exists(), "nothing was started: no store, no queue"


def test_serve_with_tokens_gets_past_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate_settings(tmp_path, monkeypatch)
    monkeypatch.setenv(
        "CONTROLROOM_AUTH_TOKENS",
        f'[{{"name": "ops", "token": "{TOKENS["admin"]}", "role": "admin"}}]',
    )
    # A taken port stops serve right after the check, at the bind, without serving.
    with socket.create_server(("0.0.0.0", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli.app, ["serve", "--host", "0.0.0.0", "--port", str(port)])
    assert result.exit_code == 1
    assert f"cannot listen on 0.0.0.0:{port}" in result.output
    assert TOKENS["admin"] not in result.output
