"""A NUL in a text field of a JSON body that the store would keep is a 422 naming the
field, on every provider (breaker pass: SQLite stored it, PostgreSQL, which keeps no NUL
in text, answered a 400 naming nothing; README "Bad input"). An edited message's body is
bytes sent to a queue, not stored text: a NUL in it stays allowed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

GROUP = "28d3aab4-f68d-4498-aa67-1eb544cd2c26"  # fixed: each xdist worker collects one id
REDIRECT = "6f1c64a4-3cbe-4b5c-a1a9-4a3f3e0f3d11"
WINDOW = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"}


@pytest.mark.parametrize(
    ("method", "path", "body", "where"),
    [
        (
            "POST",
            f"/api/recoverability/groups/{GROUP}/comment",
            {"comment": "a\x00b"},
            ["body", "comment"],
        ),
        (
            "POST",
            "/api/redirects",
            {"fromphysicaladdress": "a\x00b", "tophysicaladdress": "c"},
            ["body", "fromphysicaladdress"],
        ),
        (
            "POST",
            "/api/redirects",
            {"fromphysicaladdress": "a", "tophysicaladdress": "c\x00"},
            ["body", "tophysicaladdress"],
        ),
        (
            "PUT",
            f"/api/redirects/{REDIRECT}",
            {"fromphysicaladdress": "a", "tophysicaladdress": "\x00c"},
            ["body", "tophysicaladdress"],
        ),
        (
            "PATCH",
            "/api/pendingretries/queues/resolve",
            {"queueaddress": "q\x00", **WINDOW},
            ["body", "queueaddress"],
        ),
        (
            "POST",
            "/api/pendingretries/queues/retry",
            {"queueaddress": "q\x00", **WINDOW},
            ["body", "queueaddress"],
        ),
        # Breaker pass (fourth): a NUL after the time was read past, and 300 resolved.
        (
            "PATCH",
            "/api/pendingretries/queues/resolve",
            {"queueaddress": "q", "from": "2020-01-01", "to": "2030-01-01T00:00:00\x00"},
            ["body", "to"],
        ),
        (
            "POST",
            "/api/pendingretries/queues/retry",
            {"queueaddress": "q", "from": "2020-01-01T00:00:00\x00", "to": "2030-01-01"},
            ["body", "from"],
        ),
        ("POST", "/api/errors/retry", ["a\x00b"], ["body", 0]),
        ("POST", "/api/pendingretries/retry", ["a\x00b"], ["body", 0]),
    ],
)
def test_a_nul_in_a_stored_text_field_is_a_422_naming_it(
    client: TestClient, method: str, path: str, body: Any, where: list[object]
) -> None:
    response = client.request(method, path, json=body)

    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == where
    assert "NUL" in error["msg"]


@pytest.mark.parametrize(
    ("method", "path", "body", "where"),
    [
        (
            "POST",
            f"/api/recoverability/groups/{GROUP}/comment",
            {"comment": "a\ud800b"},
            ["body", "comment"],
        ),
        (
            "POST",
            "/api/redirects",
            {"fromphysicaladdress": "a\ud800", "tophysicaladdress": "b"},
            ["body", "fromphysicaladdress"],
        ),
        (
            "PATCH",
            "/api/pendingretries/queues/resolve",
            {"queueaddress": "q\udfff", **WINDOW},
            ["body", "queueaddress"],
        ),
        ("POST", "/api/errors/retry", ["\ud800"], ["body", 0]),
        ("POST", "/api/pendingretries/retry", ["\ud800"], ["body", 0]),
    ],
)
def test_a_lone_surrogate_in_a_stored_text_field_is_a_422_naming_it(
    client: TestClient, method: str, path: str, body: Any, where: list[object]
) -> None:
    """JSON may escape half of a surrogate pair alone (``"\\ud800"``), which is no text a
    store keeps or an answer can encode (breaker pass, fifth: 500 on both providers; the
    retry's 404 naming the id could not be encoded)."""
    sent = json.dumps(body).encode()  # "\\ud800" escaped, as a client's JSON may hold it
    response = client.request(
        method, path, content=sent, headers={"content-type": "application/json"}
    )

    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == where
    # Ours, or pydantic's own where it reads the field from the raw JSON.
    assert "lone surrogate" in error["msg"] or "unicode string" in error["msg"], error
