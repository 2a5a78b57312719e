"""A query parameter a route does not take, or one given twice: Controlroom's own routes
refuse it, naming it; ServiceControl's routes ignore it, as ServiceControl does
(docs/decisions.md "Our own routes refuse a parameter they do not take")."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

OWN_ROUTES = [
    "/api/site-calls",
    "/api/site-calls/kpis",
    "/api/audit-log",
    "/api/notifications",
    "/api/sites",
]


@pytest.mark.parametrize("path", OWN_ROUTES)
def test_our_own_routes_refuse_a_parameter_they_do_not_take_naming_it(
    client: TestClient, path: str
) -> None:
    # A user who guessed "cursor" for "after" must not page the first page forever.
    answer = client.get(path, params={"cursor": "abc"})

    assert answer.status_code == 422, answer.text
    (problem,) = answer.json()["detail"]
    assert problem["loc"] == ["query", "cursor"]
    assert "not a parameter" in problem["msg"]
    assert client.get(path).status_code == 200


def test_the_refusal_lists_the_parameters_the_route_takes(client: TestClient) -> None:
    answer = client.get("/api/site-calls", params={"cursor": "abc"})

    (problem,) = answer.json()["detail"]
    assert "after" in problem["msg"] and "limit" in problem["msg"]
    assert client.get("/api/site-calls", params={"limit": 5}).status_code == 200


REPEATED = [
    ("/api/site-calls", "limit=5"),
    ("/api/site-calls/kpis", "site=plant-7"),
    ("/api/site-calls/rejected", "limit=5"),
    ("/api/kpi-history", "metric=parked"),
    ("/api/audit-log", "actor=ops"),
    ("/api/notifications", "limit=5"),
    ("/api/notifications/rejected", "limit=5"),
    ("/api/notifications/kpi-history", "metric=parked"),
]


@pytest.mark.parametrize(("path", "parameter"), REPEATED)
def test_our_own_routes_refuse_a_parameter_given_twice_naming_it(
    client: TestClient, path: str, parameter: str
) -> None:
    # Each takes one value: which of two it read would be a guess the client cannot see.
    answer = client.get(f"{path}?{parameter}&{parameter}")

    name = parameter.split("=")[0]
    assert answer.status_code == 400, answer.text
    assert answer.json()["detail"] == f"{name}: give it at most once"
    assert client.get(f"{path}?{parameter}").status_code == 200


def test_a_write_ignores_a_parameter_it_does_not_take(client: TestClient) -> None:
    # A site agent's stray parameter must not stop its telemetry.
    answer = client.post("/api/site-calls/telemetry", params={"cursor": "abc"}, json=[])

    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("path", ["/api/errors", "/api/recoverability/groups", "/api/endpoints"])
def test_servicecontrols_routes_ignore_a_parameter_they_do_not_take(
    client: TestClient, path: str
) -> None:
    # ServicePulse and scripts written for ServiceControl send parameters we do not read.
    assert client.get(path, params={"cursor": "abc"}).status_code == 200
