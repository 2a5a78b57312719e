"""The Retry/Discard relay: each outcome, its HTTP answer, and the audit event it writes
(one on Applied, none otherwise). Central on every provider; the site agent on loopback."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from controlroom.db.tables import site_calls
from controlroom.site import SiteAgent, SiteSettings
from tests.reconciliation.harness import (
    OPERATOR,
    READER,
    SITE_TOKEN,
    TricklingSite,
    as_site,
    audit_events,
    central_rows,
    central_settings,
    eventually,
    running_agent,
    running_central,
    site_entry,
)
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.site.http import loopback_listener, serving, url_of


class Switch:
    """An operation that fails transiently until it is turned on."""

    def __init__(self) -> None:
        self.on = False

    def __call__(self, _payload: object) -> None:
        if not self.on:
            raise ConnectionError("target unreachable")


@contextlib.contextmanager
def parked_call(
    database_url: str, tmp_path: Path, site_url: str | None = None, **reconciliation: object
) -> Iterator[tuple[SiteAgent, Switch, str, str, Any, sa.Engine]]:
    """A site agent with one Parked call that central mirrors; the sites entry points at
    ``site_url`` when given (a broken site), else at the agent."""
    listener = loopback_listener()
    settings = SiteSettings(
        site_id="plant-7",
        node="node-a",
        store_path=tmp_path / "site" / "tracking.db",
        token=SITE_TOKEN,
        max_retries=1,
        backoff_base=3600,
        backoff_cap=3600,
    )
    sites = [site_entry("plant-7", site_url or url_of(listener))]
    central = central_settings(database_url, tmp_path / "central", sites, **reconciliation)
    switch = Switch()
    with (
        running_agent(settings, listener) as agent,
        running_central(central) as (central_url, app, engine),
    ):
        agent.register("switch", switch)
        call_id = agent.cached_call("erp/stock", "switch", {}).tracked_operation_id
        packets = [packet for _, packet in agent.store.pending_packets(100)]
        httpx.post(
            f"{central_url}/api/site-calls/telemetry",
            json=packets,
            headers=as_site("plant-7"),
            timeout=TEST_CLIENT_TIMEOUT,
        )
        assert central_rows(engine)[call_id]["status"] == "Parked"
        yield agent, switch, call_id, central_url, app, engine


def relay(central_url: str, call_id: str, command: str, headers: dict) -> httpx.Response:
    return httpx.post(
        f"{central_url}/api/site-calls/{call_id}/{command}",
        headers=headers,
        timeout=TEST_CLIENT_TIMEOUT,
    )


def assert_applied(agent: SiteAgent, call_id: str, command: str) -> None:
    """The site applied ``command``: a retry starts the call's next epoch (its status may
    already have moved on: the agent attempts it at once, the switch is off, and one retry
    parks it again), a discard ends it Discarded."""
    state = agent.store.state(call_id)
    assert state is not None
    if command == "retry":
        assert state.epoch == 1
    else:
        assert (str(state.status), state.epoch) == ("Discarded", 0)


@pytest.mark.parametrize("command", ["retry", "discard"])
def test_applied_writes_one_audit_event_naming_the_operator(
    database_url: str, tmp_path: Path, command: str
) -> None:
    with parked_call(database_url, tmp_path) as (agent, _switch, call_id, url, _app, engine):
        answer = relay(url, call_id, command, OPERATOR)
        assert (answer.status_code, answer.json()["outcome"]) == (200, "Applied")
        assert_applied(agent, call_id, command)
        assert central_rows(engine)[call_id]["status"] == "Parked"  # central never edits it
        (event,) = audit_events(engine, action="CachedResolve")
        assert (event["actor"], event["correlation_id"], event["outcome"]) == (
            "alice",
            call_id,
            "Success",
        )
        assert json.loads(event["details_json"]) == {
            "command": command.title(),
            "channel": "ApiOutbound",
            "target": "erp/stock",
        }
        items = httpx.get(
            f"{url}/api/eventlogitems", headers=OPERATOR, timeout=TEST_CLIENT_TIMEOUT
        ).json()
        relayed = [i for i in items if i["event_type"] == f"SiteCall{command.title()}Relayed"]
        assert [i["related_to"][0] for i in relayed] == [f"/site-call/{call_id}"]


def test_a_call_not_parked_at_central_is_refused_without_asking_the_site(
    database_url: str, tmp_path: Path
) -> None:
    with parked_call(database_url, tmp_path) as (agent, switch, call_id, url, app, engine):
        switch.on = True
        agent.retry(call_id, "bob")
        agent.attempt_due()
        app.state.reconciliation.run_pass_now()
        assert central_rows(engine)[call_id]["status"] == "Delivered"
        answer = relay(url, call_id, "retry", OPERATOR)
        assert (answer.status_code, answer.json()["outcome"]) == (409, "NotParked")
        assert "Delivered" in answer.json()["message"]
        assert audit_events(engine, action="CachedResolve") == []


def test_a_call_the_site_no_longer_has_parked_is_not_parked(
    database_url: str, tmp_path: Path
) -> None:
    with parked_call(database_url, tmp_path) as (agent, switch, call_id, url, _app, engine):
        switch.on = True
        agent.retry(call_id, "bob")
        agent.attempt_due()  # delivered at the site; central's copy is still Parked
        answer = relay(url, call_id, "discard", OPERATOR)
        assert (answer.status_code, answer.json()["outcome"]) == (409, "NotParked")
        assert "central's copy is behind" in answer.json()["message"]
        assert audit_events(engine, action="CachedResolve") == []


def test_an_unreachable_site(database_url: str, tmp_path: Path) -> None:
    closed = loopback_listener()
    closed_url = url_of(closed)
    closed.close()  # nothing listens there any more
    with parked_call(database_url, tmp_path, closed_url) as (_a, _s, call_id, url, _app, engine):
        answer = relay(url, call_id, "retry", OPERATOR)
        assert (answer.status_code, answer.json()["outcome"]) == (503, "SiteUnreachable")
        assert "could not be reached" in answer.json()["message"]
        assert audit_events(engine, action="CachedResolve") == []


class HangingSite:
    """A site that answers nothing until ``release`` (at most 30 s)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.app = FastAPI()
        self.app.add_api_route("/site/tracking/{call}/{command}", self._hang, methods=["POST"])

    def _hang(self, call: str, command: str) -> JSONResponse:
        self.release.wait(30)
        return JSONResponse({"outcome": "Applied"})


@pytest.mark.parametrize(
    ("make_site", "cause"),
    # Silent, httpx's read timeout and the whole answer's deadline fall together.
    [(HangingSite, "ReadTimeout|AnswerTooSlow"), (TricklingSite, "AnswerTooSlow")],
)
def test_a_site_that_does_not_answer_in_time(
    database_url: str, tmp_path: Path, make_site: Any, cause: str
) -> None:
    """A site that answers nothing, or (breaker pass, seventh) sends its answer a byte
    every 0.2 s: httpx's timeout bounds each read only, and the trickling site held the
    relay for as long as it liked (75 s and more with a 10 s request_timeout). The whole
    answer must come within the timeout."""
    site = make_site()
    with (
        serving(site.app) as site_url,
        parked_call(database_url, tmp_path, site_url, request_timeout=1.0) as (
            _a,
            _s,
            call_id,
            url,
            _app,
            engine,
        ),
    ):
        try:
            answer = relay(url, call_id, "retry", OPERATOR)
        finally:
            site.release.set()
        assert (answer.status_code, answer.json()["outcome"]) == (503, "SiteUnreachable")
        said = answer.json()["message"]
        assert re.search(
            rf"did not answer in time \(({cause})\); the command may have been applied", said
        )
        assert audit_events(engine, action="CachedResolve") == []


def test_relays_waiting_for_a_site_leave_the_other_routes_answering(
    database_url: str, tmp_path: Path
) -> None:
    """Breaker pass (seventh): 45 relays to a site that trickled its answers took every
    thread of the API's pool, and ``/api/health``, ``/api/errors`` and the console
    answered nothing until the site was stopped. A relay waits without a thread."""
    site = TricklingSite()
    with (
        serving(site.app) as site_url,
        parked_call(database_url, tmp_path, site_url, request_timeout=50.0) as (
            _a,
            _s,
            call_id,
            url,
            _app,
            _engine,
        ),
        ThreadPoolExecutor(45) as pool,
    ):
        try:
            relays = [pool.submit(relay, url, call_id, "retry", OPERATOR) for _ in range(45)]
            eventually(lambda: site.requests >= 40, what="40 relays waiting on the site")
            health = httpx.get(f"{url}/api/health", timeout=TEST_CLIENT_TIMEOUT)
            errors = httpx.get(f"{url}/api/errors", headers=READER, timeout=TEST_CLIENT_TIMEOUT)
            waiting = sum(not relay.done() for relay in relays)
        finally:
            site.release.set()
        assert (health.status_code, errors.status_code) == (200, 200)
        assert waiting == 45  # answered while every relay still waited


def test_a_site_that_fails_the_operation(database_url: str, tmp_path: Path) -> None:
    erring = FastAPI()
    erring.add_api_route(
        "/site/tracking/{call}/{command}",
        lambda call, command: JSONResponse({"detail": "disk full"}, 500),
        methods=["POST"],
    )
    with (
        serving(erring) as erring_url,
        parked_call(database_url, tmp_path, erring_url) as (_a, _s, call_id, url, _app, engine),
    ):
        answer = relay(url, call_id, "retry", OPERATOR)
        assert (answer.status_code, answer.json()["outcome"]) == (502, "OperationFailed")
        assert "HTTP 500" in answer.json()["message"]
        assert audit_events(engine, action="CachedResolve") == []


def test_a_purged_call_is_not_found_and_audits_nothing(database_url: str, tmp_path: Path) -> None:
    with parked_call(database_url, tmp_path) as (_agent, _switch, call_id, url, _app, engine):
        with engine.begin() as conn:  # what the retention purge does to an old row
            conn.execute(sa.delete(site_calls).where(site_calls.c.tracked_operation_id == call_id))
        for command in ("retry", "discard"):
            answer = relay(url, call_id, command, OPERATOR)
            assert (answer.status_code, answer.json()["detail"]) == (404, "site call not found")
        answer = relay(url, str(uuid.uuid4()), "retry", OPERATOR)
        assert answer.status_code == 404
        assert audit_events(engine, action="CachedResolve") == []


def test_a_reader_may_not_relay(database_url: str, tmp_path: Path) -> None:
    with parked_call(database_url, tmp_path) as (agent, _switch, call_id, url, _app, engine):
        for command in ("retry", "discard"):
            assert relay(url, call_id, command, READER).status_code == 403
        assert str(agent.store.state(call_id).status) == "Parked"
        assert audit_events(engine, action="CachedResolve") == []


def test_a_failed_audit_write_does_not_change_the_outcome(
    database_url: str, tmp_path: Path
) -> None:
    with parked_call(database_url, tmp_path) as (agent, _switch, call_id, url, _app, engine):
        with engine.begin() as conn:  # the audit log cannot be written
            conn.exec_driver_sql("ALTER TABLE audit_log RENAME TO audit_log_away")
        answer = relay(url, call_id, "retry", OPERATOR)
        assert (answer.status_code, answer.json()["outcome"]) == (200, "Applied")
        assert_applied(agent, call_id, "retry")
