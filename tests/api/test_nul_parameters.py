"""A NUL in a query or path parameter of any API route is a 422 naming the parameter, on
every provider (breaker pass, second: on PostgreSQL, which stores no NUL in text, these
answered a generic 400 "the database refused a value of this request" naming nothing,
while ``/api/errors?queueaddress=%00`` named its parameter; README "Bad input")."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

GROUP = "28d3aab4-f68d-4498-aa67-1eb544cd2c26"  # fixed: each xdist worker collects one id


@pytest.mark.parametrize(
    ("method", "path", "where"),
    [
        ("GET", "/api/site-calls?site=%00", ["query", "site"]),
        ("GET", "/api/site-calls?node=%00", ["query", "node"]),
        ("GET", "/api/audit-log?actor=%00", ["query", "actor"]),
        ("GET", "/api/site-calls/kpis?site=%00", ["query", "site"]),
        (
            "GET",
            "/api/kpi-history?metric=buffered&scope=site&scope_key=%00",
            ["query", "scope_key"],
        ),
        ("GET", "/api/notifications?source=%00", ["query", "source"]),
        ("GET", "/api/notifications?target=%00", ["query", "target"]),
        ("POST", f"/api/recoverability/groups/{GROUP}/comment?comment=%00", ["query", "comment"]),
        ("POST", "/api/errors/queues/a%00b/retry", ["path", "queueaddress"]),
        ("GET", "/api/conversations/a%00b", ["path", "conversationid"]),
    ],
)
def test_a_nul_in_a_parameter_is_a_422_naming_it(
    client: TestClient, method: str, path: str, where: list[str]
) -> None:
    response = client.request(method, path)

    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == where
    assert "NUL" in error["msg"]
