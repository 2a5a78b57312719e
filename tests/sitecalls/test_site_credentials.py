"""A site may speak only for itself (docs/design.md "Site credentials"), on each provider:
telemetry is accepted under the posting site's own token only, for its own
``source_site`` only; a packet naming another site makes the whole request a 403 and is
kept nowhere; an operator's token, whatever its role, may not post telemetry, and a
site's token may do nothing else."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from pydantic import ValidationError

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.tables import audit_log, rejected_telemetry, site_calls
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.http.auth import SitePrincipal, TokenTable
from tests.sitecalls.packets import packet

NORTH_TOKEN = "north-telemetry-token-0123"
SOUTH_TOKEN = "south-telemetry-token-0123"
NORTH_AGENT_SECRET = "north-agent-secret-0123456"
OPERATOR_TOKEN = "operator-token-0123456789"
ADMIN_TOKEN = "admin-token-0123456789abc"
READER_TOKEN = "reader-token-0123456789ab"
SITES = [
    {
        "id": "north",
        "base_url": "http://127.0.0.1:9",
        "token": NORTH_AGENT_SECRET,
        "central_token": NORTH_TOKEN,
    },
    {"id": "south", "base_url": "http://127.0.0.1:9", "central_token": SOUTH_TOKEN},
]
OPERATORS = [
    {"name": "oscar", "token": OPERATOR_TOKEN, "role": "operator"},
    {"name": "ada", "token": ADMIN_TOKEN, "role": "admin"},
    {"name": "rita", "token": READER_TOKEN, "role": "reader"},
]
TELEMETRY = "/api/site-calls/telemetry"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def event_packet(site: str, **fields: Any) -> dict[str, Any]:
    """A new call of ``site`` with its audit event."""
    return packet(
        "Submitted",
        op_id=str(uuid.uuid4()),
        event_id=str(uuid.uuid4()),
        source_site=site,
        **fields,
    )


def kept_rows(engine: sa.Engine) -> list[int]:
    """Rows in site_calls, audit_log and rejected_telemetry."""
    with engine.connect() as conn:
        return [
            conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
            for table in (site_calls, audit_log, rejected_telemetry)
        ]


def app_client(tmp_path: Path, database_url: str, engine: sa.Engine, **settings: Any) -> TestClient:
    configured = Settings(data_dir=tmp_path / "data", database_url=database_url, **settings)
    return TestClient(create_app(configured, engine, FileSystemBodyStore(configured.body_dir)))


@pytest.fixture
def client(tmp_path: Path, database_url: str, engine: sa.Engine) -> Iterator[TestClient]:
    """Central with operator tokens and two sites, each with its telemetry token."""
    with app_client(
        tmp_path, database_url, engine, auth_tokens=OPERATORS, sites=SITES
    ) as test_client:
        yield test_client


def test_a_site_token_posting_its_own_telemetry_is_accepted(
    client: TestClient, engine: sa.Engine
) -> None:
    own = event_packet("north")
    answer = client.post(TELEMETRY, json=[own, "not a packet"], headers=bearer(NORTH_TOKEN))
    assert answer.status_code == 200, answer.text
    assert answer.json()["accepted"] == [0]
    # A packet the contract refuses is kept as rejected telemetry, as without tokens.
    assert kept_rows(engine) == [1, 1, 1]
    call = client.get(
        f"/api/site-calls/{own['tracked_operation_id']}", headers=bearer(READER_TOKEN)
    )
    assert call.json()["source_site"] == "north"


@pytest.mark.parametrize(
    "foreign",
    [
        event_packet("south"),
        event_packet("SOUTH"),
        # Refused by the contract too: still kept nowhere, not even as rejected telemetry.
        event_packet("south", surprise=1),
        {**event_packet("north"), "source_site": None},
    ],
    ids=["another-site", "another-case", "also-malformed", "null-site"],
)
def test_a_site_token_posting_another_sites_telemetry_is_403_and_kept_nowhere(
    client: TestClient, engine: sa.Engine, foreign: dict[str, Any]
) -> None:
    own = event_packet("north")
    answer = client.post(TELEMETRY, json=[own, foreign, own], headers=bearer(NORTH_TOKEN))
    assert answer.status_code == 403, answer.text
    detail = answer.json()["detail"]
    assert "source_site" in detail and "at 1 " in detail and "'north'" in detail
    assert NORTH_TOKEN not in answer.text
    assert kept_rows(engine) == [0, 0, 0]


@pytest.mark.parametrize("token", [OPERATOR_TOKEN, ADMIN_TOKEN, READER_TOKEN])
def test_an_operators_token_may_not_post_telemetry(
    client: TestClient, engine: sa.Engine, token: str
) -> None:
    answer = client.post(TELEMETRY, json=[event_packet("north")], headers=bearer(token))
    assert answer.status_code == 403, answer.text
    assert "site's own token" in answer.json()["detail"]
    assert kept_rows(engine) == [0, 0, 0]


def test_telemetry_without_a_valid_token_is_401(client: TestClient, engine: sa.Engine) -> None:
    """Each 401 says which token telemetry takes (fresh-user pass, sixth: "a bearer token
    is required" left the sender to guess an operator's would do)."""
    for headers in ({}, bearer("not-a-configured-token-at-all")):
        answer = client.post(TELEMETRY, json=[event_packet("north")], headers=headers)
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"].startswith("Bearer")
        assert "the site's own token (sites[].central_token" in answer.json()["detail"]
    assert kept_rows(engine) == [0, 0, 0]


def test_a_site_token_may_do_nothing_else(client: TestClient) -> None:
    headers = bearer(NORTH_TOKEN)
    for method, path in [
        ("GET", "/api/site-calls"),
        ("GET", "/api/sites"),
        ("POST", "/api/sites/north/reconcile"),
        ("POST", f"/api/site-calls/{uuid.uuid4()}/retry"),
        ("GET", "/api/errors"),
    ]:
        answer = client.request(method, path, headers=headers)
        assert answer.status_code == 403, (method, path, answer.text)
        assert "site:north" in answer.text and NORTH_TOKEN not in answer.text
    # Nor does it sign in to the console.
    signed_in = client.post(
        "/signin", data={"token": NORTH_TOKEN, "next": "/"}, follow_redirects=False
    )
    assert signed_in.status_code == 303  # back to the form, which says why it was refused
    assert "refused=site" in signed_in.headers["location"]
    assert "controlroom_session" not in signed_in.cookies
    form = client.get(signed_in.headers["location"])
    assert "That token is a site&#39;s: it posts telemetry and cannot sign in." in form.text


def test_site_tokens_alone_close_telemetry_but_leave_the_open_api_open(
    tmp_path: Path, database_url: str, engine: sa.Engine
) -> None:
    """On loopback without operator tokens the API stays open (the dev mode), but once a
    site's token is configured, telemetry needs it."""
    with app_client(tmp_path, database_url, engine, sites=SITES) as client:
        assert client.get("/api/site-calls").status_code == 200
        assert client.post(TELEMETRY, json=[event_packet("north")]).status_code == 401
        answer = client.post(TELEMETRY, json=[event_packet("north")], headers=bearer(NORTH_TOKEN))
        assert answer.status_code == 200
        assert answer.json()["accepted"] == [0]


def test_without_any_token_telemetry_is_open_for_every_site(
    tmp_path: Path, database_url: str, engine: sa.Engine
) -> None:
    with app_client(tmp_path, database_url, engine) as client:
        answer = client.post(TELEMETRY, json=[event_packet("north"), event_packet("south")])
        assert answer.status_code == 200
        assert answer.json()["accepted"] == [0, 1]


def test_site_secrets_are_never_shown(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    admin = bearer(ADMIN_TOKEN)
    shown = [
        client.get(path, headers=admin).text
        for path in ("/api/sites", "/api/configuration", "/openapi.json")
    ]
    shown.append(repr(Settings(auth_tokens=OPERATORS, sites=SITES)))
    shown.append(caplog.text)
    for secret in (NORTH_TOKEN, SOUTH_TOKEN, NORTH_AGENT_SECRET):
        assert all(secret not in text for text in shown)


# --- the settings and the token table (no database) ----------------------------------------
def test_each_caller_needs_a_token_of_its_own() -> None:
    with pytest.raises(ValidationError, match="configured twice"):
        Settings(
            auth_tokens=[{"name": "oscar", "token": NORTH_TOKEN, "role": "operator"}], sites=SITES
        )
    twin = {**SITES[1], "central_token": NORTH_TOKEN}
    with pytest.raises(ValidationError, match="configured twice"):
        Settings(sites=[SITES[0], twin])
    with pytest.raises(ValidationError, match="one secret per direction"):
        Settings(sites=[{**SITES[0], "central_token": NORTH_AGENT_SECRET}])


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        # An operator's token sent to a site on every pull: the site could act as him.
        (
            {"auth_tokens": [{"name": "oscar", "token": NORTH_AGENT_SECRET, "role": "operator"}]},
            "auth_tokens[0].token and sites[0].token",
        ),
        # One site's pull token is another's: either site could pull from the other.
        ({"sites": [SITES[0], {**SITES[1], "token": NORTH_AGENT_SECRET}]}, "sites[0].token and "),
        # One site's posting token is what central presents to another site.
        ({"sites": [SITES[0], {**SITES[1], "token": NORTH_TOKEN}]}, "sites[0].central_token and "),
        # Two sites posting with one token: the message named auth_tokens, not involved.
        (
            {"sites": [SITES[0], {**SITES[1], "central_token": NORTH_TOKEN}]},
            "sites[0].central_token and sites[1].central_token",
        ),
    ],
)
def test_every_token_central_holds_is_its_own(settings: dict[str, object], named: str) -> None:
    """Fresh-user pass (second): a site's ``token`` equal to an operator's token, or to
    another site's token or ``central_token``, was taken; two sites sharing a
    ``central_token`` were refused naming ``auth_tokens``. Each secret is one caller's,
    in one direction, and the refusal names the two places that share one."""
    with pytest.raises(ValidationError) as refused:
        Settings(**{"sites": SITES, **settings})
    message = str(refused.value)
    assert "configured twice" in message and named in message
    for secret in (NORTH_TOKEN, NORTH_AGENT_SECRET):
        assert secret not in message


def test_the_token_table_tells_sites_from_operators() -> None:
    settings = Settings(auth_tokens=OPERATORS, sites=SITES)
    table = TokenTable(settings.auth_tokens, settings.sites)
    assert table.identify(NORTH_TOKEN) == SitePrincipal("north")
    assert table.find(NORTH_TOKEN) is None  # a site never signs in to the console
    assert table.named("site:north") is None
    assert table.find(OPERATOR_TOKEN) is not None
    assert not table.open and not table.sites_open
    only_sites = TokenTable([], settings.sites)
    assert only_sites.open and not only_sites.sites_open
    assert TokenTable([], []).sites_open
