"""A site agent calling flaky HTTP targets, its telemetry at central, an operator's Retry
relayed through central: real HTTP on loopback, central on every provider."""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx
import pytest

from controlroom.site import CachedCallFailed, SiteSettings, Status
from tests.reconciliation.harness import (
    OPERATOR,
    SITE_TOKEN,
    audit_events,
    central_rows,
    central_settings,
    central_token_of,
    eventually,
    rejected_packets,
    running_agent,
    running_central,
    site_entry,
)
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.site.http import FlakyTargets, loopback_listener, serving, url_of


def agent_settings(tmp_path: Path, central_url: str, **overrides: object) -> SiteSettings:
    values: dict[str, object] = {
        "site_id": "plant-7",
        "node": "node-a",
        "store_path": tmp_path / "site" / "tracking.db",
        "token": SITE_TOKEN,
        "central_url": central_url,
        "central_token": central_token_of("plant-7"),
        "max_retries": 3,
        "backoff_base": 0.05,
        "backoff_cap": 0.2,
        "retry_poll": 0.05,
        "outbox_poll": 0.05,
    }
    return SiteSettings(**{**values, **overrides})


def test_delivered_failed_parked_then_an_operator_retry_delivers(
    database_url: str, tmp_path: Path
) -> None:
    targets = FlakyTargets()
    targets.fail_times["invoice"] = 2
    listener = loopback_listener()
    sites = [site_entry("plant-7", url_of(listener))]
    with contextlib.ExitStack() as stack:
        target_url = stack.enter_context(serving(targets.app))
        central_url, _app, engine = stack.enter_context(
            running_central(central_settings(database_url, tmp_path / "central", sites))
        )
        agent = stack.enter_context(running_agent(agent_settings(tmp_path, central_url), listener))
        recovers = agent.http_call("POST", f"{target_url}/recovers/invoice", json={"n": 1})
        assert recovers.status is Status.ATTEMPTED
        with pytest.raises(CachedCallFailed) as rejected:
            agent.http_call("POST", f"{target_url}/reject/order")
        failed_id = rejected.value.state.tracked_operation_id
        parked_id = agent.http_call("POST", f"{target_url}/always-503/stock")
        parked_id = parked_id.tracked_operation_id

        expected = {
            recovers.tracked_operation_id: "Delivered",
            failed_id: "Failed",
            parked_id: "Parked",
        }
        eventually(
            lambda: (
                {k: v["status"] for k, v in central_rows(engine).items()} == expected
                and agent.store.outbox_size() == 0
            ),
            what="central mirrors Delivered, Failed and Parked",
        )
        assert central_rows(engine)[failed_id]["http_status"] == 400
        assert central_rows(engine)[parked_id]["retry_count"] == 3

        targets.fixed.add("stock")
        answer = httpx.post(
            f"{central_url}/api/site-calls/{parked_id}/retry",
            headers=OPERATOR,
            timeout=TEST_CLIENT_TIMEOUT,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["outcome"] == "Applied"
        eventually(
            lambda: central_rows(engine)[parked_id]["status"] == "Delivered",
            what="the retried call delivered at central",
        )
        row = central_rows(engine)[parked_id]
        assert row["epoch"] == 1
        resolves = audit_events(engine, action="CachedResolve")
        assert [(e["actor"], e["correlation_id"]) for e in resolves] == [("alice", parked_id)]
        # The site's own audit trail arrived with its telemetry.
        actions = {e["action"] for e in audit_events(engine, correlation_id=parked_id)}
        assert {"CachedCallSubmitted", "CachedCallParked", "CachedCallRetried"} <= actions
        assert rejected_packets(engine) == []  # every packet met the contract
