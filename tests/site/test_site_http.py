"""The agent's HTTP API on loopback: the pull contract, its token, cached HTTP calls, and
the outbox riding out a central outage."""

from __future__ import annotations

import socket
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from controlroom.runtime.sockets import listen
from controlroom.site import SiteSettings
from tests.nodelay import accepted_with_nodelay
from tests.reconciliation.harness import (
    SITE_TOKEN,
    central_rows,
    central_settings,
    central_token_of,
    eventually,
    running_agent,
    running_central,
    seed_site_rows,
    site_entry,
)
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.site.http import FlakyTargets, serving

AUTH = {"Authorization": f"Bearer {SITE_TOKEN}"}
T = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def settings(tmp_path: Path, **overrides: object) -> SiteSettings:
    values: dict[str, object] = {
        "site_id": "plant-7",
        "store_path": tmp_path / "site" / "tracking.db",
        "token": SITE_TOKEN,
        "backoff_base": 3600,
        "backoff_cap": 3600,
    }
    return SiteSettings(**{**values, **overrides})


def test_the_pull_contract_pages_strictly_after_the_cursor(tmp_path: Path) -> None:
    with running_agent(settings(tmp_path)) as agent:
        ids = seed_site_rows(agent, 5, T)
        url = f"{agent.url}/site/tracking/changes"
        first = httpx.get(
            url, params={"limit": 2}, headers=AUTH, timeout=TEST_CLIENT_TIMEOUT
        ).json()
        assert [r["tracked_operation_id"] for r in first["rows"]] == ids[:2]
        assert first["more_available"] is True
        last = first["rows"][-1]
        cursor = {"since": last["updated_at_utc"], "after_id": last["tracked_operation_id"]}
        second = httpx.get(
            url, params={**cursor, "limit": 10}, headers=AUTH, timeout=TEST_CLIENT_TIMEOUT
        ).json()
        assert [r["tracked_operation_id"] for r in second["rows"]] == ids[2:]
        assert second["more_available"] is False
        inclusive = httpx.get(
            url, params={"since": last["updated_at_utc"]}, headers=AUTH, timeout=TEST_CLIENT_TIMEOUT
        ).json()
        assert len(inclusive["rows"]) == 5  # without after_id the timestamp is inclusive
        assert set(first["rows"][0]) == {
            "tracked_operation_id", "channel", "target", "source_site", "source_node",
            "status", "retry_count", "last_error", "http_status", "created_at_utc",
            "updated_at_utc", "terminal_at_utc", "epoch",
        }  # fmt: skip


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"since": "2026-03-01T12:00:00"}, "since"),
        ({"after_id": "x"}, "after_id"),
        ({"since": "0001-01-01T00:00:00+05:00"}, "since"),
        ({"since": "9999-12-31T23:59:59-00:01"}, "since"),
    ],
)
def test_bad_pull_parameters_are_refused_by_name(tmp_path: Path, params: dict, field: str) -> None:
    with running_agent(settings(tmp_path)) as agent:
        answer = httpx.get(
            f"{agent.url}/site/tracking/changes",
            params=params,
            headers=AUTH,
            timeout=TEST_CLIENT_TIMEOUT,
        )
        assert answer.status_code in (400, 422)
        assert field in answer.text


def test_the_agent_needs_its_token(tmp_path: Path) -> None:
    """Central's secret guards every route of the agent: the pull, Retry/Discard and the
    cached HTTP calls; with it, each answers."""
    with running_agent(settings(tmp_path)) as agent:
        for headers in ({}, {"Authorization": "Bearer not-the-token-at-all"}):
            answer = httpx.get(
                f"{agent.url}/site/tracking/changes", headers=headers, timeout=TEST_CLIENT_TIMEOUT
            )
            assert answer.status_code == 401
            assert answer.headers["www-authenticate"] == "Bearer"
            for command in ("retry", "discard"):
                answer = httpx.post(
                    f"{agent.url}/site/tracking/x/{command}",
                    json={"operator": "eve"},
                    headers=headers,
                    timeout=TEST_CLIENT_TIMEOUT,
                )
                assert answer.status_code == 401
            answer = httpx.post(
                f"{agent.url}/site/calls",
                json={"url": "http://127.0.0.1:9/x"},
                headers=headers,
                timeout=TEST_CLIENT_TIMEOUT,
            )
            assert answer.status_code == 401
        assert agent.store.changes(None, None, 10) == ([], False)  # no call was made
        pulled = httpx.get(
            f"{agent.url}/site/tracking/changes", headers=AUTH, timeout=TEST_CLIENT_TIMEOUT
        )
        assert pulled.status_code == 200
        for command in ("retry", "discard"):
            answer = httpx.post(
                f"{agent.url}/site/tracking/x/{command}",
                json={"operator": "eve"},
                headers=AUTH,
                timeout=TEST_CLIENT_TIMEOUT,
            )
            assert (answer.status_code, answer.json()) == (404, {"outcome": "NotFound"})


def test_cached_http_calls_over_the_agent_api(tmp_path: Path) -> None:
    targets = FlakyTargets()
    with serving(targets.app) as target_url, running_agent(settings(tmp_path)) as agent:
        calls = f"{agent.url}/site/calls"
        ok = httpx.post(
            calls,
            json={"url": f"{target_url}/recovers/a"},
            headers=AUTH,
            timeout=TEST_CLIENT_TIMEOUT,
        )
        assert ok.status_code == 200 and ok.json()["status"] == "Attempted"
        rejected = httpx.post(
            calls, json={"url": f"{target_url}/reject/b"}, headers=AUTH, timeout=TEST_CLIENT_TIMEOUT
        )
        assert rejected.status_code == 422 and rejected.json()["status"] == "Failed"
        assert "HTTP 400" in rejected.json()["last_error"]
        targets.fixed.add("c")
        delivered = httpx.post(
            calls,
            json={"url": f"{target_url}/always-503/c"},
            headers=AUTH,
            timeout=TEST_CLIENT_TIMEOUT,
        )
        assert delivered.json()["status"] == "Delivered"


def test_every_connection_the_agent_accepts_has_tcp_nodelay(tmp_path: Path) -> None:
    with running_agent(settings(tmp_path)) as agent:
        host, port = agent.url.removeprefix("http://").split(":")
        assert accepted_with_nodelay(host, int(port))


def test_the_outbox_delivers_once_central_is_back(database_url: str, tmp_path: Path) -> None:
    # Central's port, with nothing listening on it yet: connections are refused.
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    central_url = f"http://127.0.0.1:{port}"
    agent_settings = settings(
        tmp_path, central_url=central_url, central_token=central_token_of("plant-7"),
        outbox_poll=0.05, outbox_backoff_cap=0.2,
    )  # fmt: skip
    with running_agent(agent_settings) as agent:
        agent.register("noop", lambda _payload: None)
        ids = [agent.cached_call("erp/x", "noop", {}).tracked_operation_id for _ in range(3)]
        assert agent.store.outbox_size() == 6  # Submitted and Delivered of each, kept
        # The site is configured at central (its telemetry token), its agent not pulled.
        sites = [site_entry("plant-7", "http://127.0.0.1:9")]
        settings_ = central_settings(database_url, tmp_path / "central", sites)
        listener = listen("127.0.0.1", port)
        with running_central(settings_, listener) as (_url, _app, engine):
            eventually(lambda: agent.store.outbox_size() == 0, what="the outbox drains")
            rows = central_rows(engine)
            assert {rows[i]["status"] for i in ids} == {"Delivered"}


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("retry", '{"operator": "ali\\u0000ce"}', "operator"),
        ("discard", '{"operator": "\\ud800"}', "operator"),
        ("retry", '{"operator": "' + "o" * 257 + '"}', "operator"),
        ("calls", '{"url": "http://erp.example/' + "a" * 300 + '"}', "url"),
        ("calls", '{"url": "http://erp.example/a\\u0000"}', "url"),
        ("calls", '{"url": "http://erp.example/a", "target": "t\\u0000"}', "target"),
        ("calls", '{"url": "http://erp.example/a", "target": "\\udc00"}', "target"),
    ],
)
def test_the_agent_refuses_what_centrals_contract_would_by_name(
    tmp_path: Path, path: str, body: str, field: str
) -> None:
    # Applied here but refused at central, the audit record of the change would be lost.
    route = "calls" if path == "calls" else f"tracking/{uuid.uuid4()}/{path}"
    with running_agent(settings(tmp_path)) as agent:
        answer = httpx.post(
            f"{agent.url}/site/{route}",
            content=body.encode(),
            headers={**AUTH, "content-type": "application/json"},
            timeout=TEST_CLIENT_TIMEOUT,
        )
        assert answer.status_code == 422, answer.text
        assert field in answer.text
        assert agent.store.states() == []
