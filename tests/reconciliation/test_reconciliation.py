"""Reconciliation passes against real site agents on loopback, central on every provider."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import site_reconciliation
from controlroom.runtime.sockets import listen
from controlroom.site import SiteAgent, SiteSettings
from controlroom.site.lifecycle import PermanentFailure
from controlroom.site.store import tracked_operations
from controlroom.site.telemetry import state_document
from controlroom.sitecalls import reconciliation
from controlroom.sitecalls.reconciliation import ReconciliationService
from controlroom.telemetry.stamps import Stamp
from tests.reconciliation.harness import (
    OPERATOR,
    READER,
    SITE_TOKEN,
    TricklingSite,
    as_site,
    central_rows,
    central_settings,
    eventually,
    legacy_site_app,
    rejected_packets,
    running_agent,
    running_central,
    seed_site_rows,
    site_entry,
    site_rows,
)
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.site.http import loopback_listener, serving, url_of

T = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LOG = "controlroom.sitecalls.reconciliation"


def agent_settings(tmp_path: Path, site_id: str = "plant-7") -> SiteSettings:
    return SiteSettings(
        site_id=site_id,
        node="node-a",
        store_path=tmp_path / site_id / "tracking.db",
        token=SITE_TOKEN,
        backoff_base=3600,  # nothing retries on its own during a test
        backoff_cap=3600,
    )


@contextlib.contextmanager
def one_site(
    database_url: str, tmp_path: Path, **reconciliation: object
) -> Iterator[tuple[SiteAgent, str, object, sa.Engine]]:
    listener = loopback_listener()
    sites = [site_entry("plant-7", url_of(listener))]
    settings = central_settings(database_url, tmp_path / "central", sites, **reconciliation)
    with (
        running_agent(agent_settings(tmp_path), listener) as agent,
        running_central(settings) as (central_url, app, engine),
    ):
        yield agent, central_url, app, engine


def site_state(engine: sa.Engine, site_id: str) -> sa.Row:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(site_reconciliation).where(site_reconciliation.c.site_id == site_id)
        ).one()


def test_lost_telemetry_self_heals_in_one_pass(database_url: str, tmp_path: Path) -> None:
    with one_site(database_url, tmp_path) as (agent, central_url, app, engine):
        outcomes = iter(random.Random(11).choices(["ok", "transient", "permanent"], k=60))

        def flaky(_payload: object) -> None:
            outcome = next(outcomes)
            if outcome == "transient":
                raise ConnectionError("target unreachable")
            if outcome == "permanent":
                raise PermanentFailure("rejected", http_status=422)

        agent.register("flaky", flaky)
        for n in range(60):
            with contextlib.suppress(Exception):
                agent.cached_call(f"erp/orders/{n}", "flaky", {"n": n})
        packets = [packet for _, packet in agent.store.pending_packets(10_000)]
        kept = [p for p in packets if random.Random(p["audit_event"]["event_id"]).random() >= 0.3]
        assert len(kept) < len(packets)
        answer = httpx.post(
            f"{central_url}/api/site-calls/telemetry",
            json=kept,
            headers=as_site("plant-7"),
            timeout=TEST_CLIENT_TIMEOUT,
        )
        assert answer.status_code == 200, answer.text
        assert central_rows(engine) != site_rows(agent)  # 30% of the packets were lost

        (result,) = app.state.reconciliation.run_pass_now()
        assert result.error is None
        assert central_rows(engine) == site_rows(agent)


def test_a_burst_sharing_one_timestamp_drains_through_the_id_tiebreak(
    database_url: str, tmp_path: Path
) -> None:
    with one_site(database_url, tmp_path, batch_size=500) as (agent, _url, app, engine):
        ids = seed_site_rows(agent, 1500, T)
        (result,) = app.state.reconciliation.run_pass_now()
        assert (result.error, result.pinned) == (None, False)
        assert set(central_rows(engine)) == set(ids)
        state = site_state(engine, "plant-7")
        assert (state.cursor_updated_at_utc, state.cursor_tracked_operation_id) == (T, max(ids))


def test_a_site_stamping_at_100_ns_drains_rows_sharing_a_microsecond(
    database_url: str, tmp_path: Path
) -> None:
    # Ten rows 100 ns apart within one microsecond, ids in the reverse order of their
    # stamps: a cursor cut to the microsecond would ask for them again and be pinned.
    with one_site(database_url, tmp_path, batch_size=5) as (agent, _url, app, engine):
        first = Stamp(T, 0)
        ids = seed_site_rows(agent, 10, first, apart=1)
        with agent.store.engine.begin() as conn:  # reverse ids: the stamp must order
            for n, ident in enumerate(ids):
                conn.execute(
                    sa.update(tracked_operations)
                    .where(tracked_operations.c.tracked_operation_id == ident)
                    .values(updated_at_tick=9 - n)
                )
        (result,) = app.state.reconciliation.run_pass_now()
        assert (result.error, result.pinned, result.pages) == (None, False, 2)
        assert central_rows(engine) == site_rows(agent)
        state = site_state(engine, "plant-7")
        cursor = (state.cursor_updated_at_utc, state.cursor_updated_at_tick)
        assert (cursor, state.cursor_tracked_operation_id) == ((T, 9), ids[0])
        (again,) = app.state.reconciliation.run_pass_now()  # nothing new, nothing pinned
        assert (again.error, again.pinned, again.rows) == (None, False, 0)


def test_a_legacy_site_is_pinned_once_and_unpinned_on_progress(
    database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = SiteAgent(agent_settings(tmp_path))
    try:
        ids = seed_site_rows(agent, 600, T)
        with serving(legacy_site_app(agent)) as legacy_url:
            settings = central_settings(
                database_url,
                tmp_path / "central",
                [site_entry("plant-7", legacy_url)],
                batch_size=500,
            )
            with running_central(settings) as (central_url, app, engine):
                caplog.set_level(logging.INFO, LOG)
                for _ in range(3):
                    (result,) = app.state.reconciliation.run_pass_now()
                    assert result.pinned
                assert _pin_events(caplog) == ["pinned"]
                assert _pin_event_log(central_url) == ["SitePinned"]
                listed = httpx.get(
                    f"{central_url}/api/sites", headers=READER, timeout=TEST_CLIENT_TIMEOUT
                ).json()
                assert listed[0]["pinned"] is True

                # 200 of the burst move on (delivered again later): the rest fits a page.
                with agent.store.engine.begin() as conn:
                    conn.execute(
                        sa.update(tracked_operations)
                        .where(tracked_operations.c.tracked_operation_id.in_(ids[:200]))
                        .values(updated_at_utc=T + timedelta(seconds=1))
                    )
                (result,) = app.state.reconciliation.run_pass_now()
                (again,) = app.state.reconciliation.run_pass_now()
                assert not result.pinned and not again.pinned
                assert _pin_events(caplog) == ["pinned", "no longer pinned"]
                assert _pin_event_log(central_url) == ["SitePinned", "SiteUnpinned"]
                assert site_state(engine, "plant-7").pinned is False
                assert set(central_rows(engine)) == set(ids)
    finally:
        agent.close()


def _pin_event_log(central_url: str) -> list[str]:
    """The pinned latch's event log items, oldest first."""
    items = httpx.get(
        f"{central_url}/api/eventlogitems", headers=READER, timeout=TEST_CLIENT_TIMEOUT
    ).json()
    return [
        item["event_type"]
        for item in reversed(items)
        if item["event_type"] in ("SitePinned", "SiteUnpinned")
        and item["related_to"] == ["/site/plant-7"]
    ]


def _pin_events(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        "no longer pinned" if "no longer pinned" in r.getMessage() else "pinned"
        for r in caplog.records
        if r.name == LOG and "pinned" in r.getMessage()
    ]


class BrokenSites:
    """A site that answers 500, and one that answers after the client gave up."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.erring = FastAPI()
        self.erring.add_api_route("/site/tracking/changes", self._error)
        self.hanging = FastAPI()
        self.hanging.add_api_route("/site/tracking/changes", self._hang)

    def _error(self) -> JSONResponse:
        return JSONResponse({"detail": "database is down"}, 500)

    def _hang(self) -> JSONResponse:
        self.release.wait(30)
        return JSONResponse({"rows": [], "more_available": False})


def test_a_failing_site_and_a_hanging_one_do_not_stop_a_healthy_one(
    database_url: str, tmp_path: Path
) -> None:
    broken = BrokenSites()
    listener = loopback_listener()
    with contextlib.ExitStack() as stack:
        erring = stack.enter_context(serving(broken.erring))
        hanging = stack.enter_context(serving(broken.hanging))
        stack.callback(broken.release.set)
        agent = stack.enter_context(running_agent(agent_settings(tmp_path), listener))
        sites = [
            site_entry("erring", erring, token="erring-agent-token-0123456789"),
            site_entry("hanging", hanging, token="hanging-agent-token-0123456789"),
            site_entry("plant-7", url_of(listener)),
        ]
        # The hanging site answers never; the timeout is what the healthy site must answer
        # within too, so it is generous for a loaded machine, not the 0.5 s it could be.
        settings = central_settings(database_url, tmp_path / "central", sites, request_timeout=5.0)
        central_url, app, engine = stack.enter_context(running_central(settings))
        ids = seed_site_rows(agent, 10, T)
        results = {r.site_id: r for r in app.state.reconciliation.run_pass_now()}
        assert results["plant-7"].error is None
        assert set(central_rows(engine)) == set(ids)
        assert "HTTP 500" in results["erring"].error
        assert "unreachable" in results["hanging"].error  # timed out
        listed = {
            s["id"]: s
            for s in httpx.get(
                f"{central_url}/api/sites", headers=READER, timeout=TEST_CLIENT_TIMEOUT
            ).json()
        }
        assert listed["erring"]["reachable"] is False and listed["erring"]["last_error"]
        assert listed["plant-7"]["reachable"] is True and listed["plant-7"]["last_error"] is None
        assert listed["plant-7"]["cursor"]["tracked_operation_id"] == max(ids)


def test_a_site_that_trickles_its_page_fails_its_pass_at_the_timeout(
    database_url: str, tmp_path: Path
) -> None:
    """Breaker pass (seventh): a site sending its page a byte every few seconds kept the
    pass running (and every other trigger refused) for as long as it liked, and was shown
    reachable. The whole page must come within ``request_timeout``."""
    site = TricklingSite()
    with contextlib.ExitStack() as stack:
        trickling = stack.enter_context(serving(site.app))
        stack.callback(site.release.set)
        sites = [site_entry("trickling", trickling, token="trickling-agent-token-0123456789")]
        settings = central_settings(database_url, tmp_path / "central", sites, request_timeout=1.0)
        _url, app, _engine = stack.enter_context(running_central(settings))
        [result] = app.state.reconciliation.run_pass_now()
    assert result.error is not None
    assert "unreachable: AnswerTooSlow: no whole answer within 1 s" in result.error


class OversizedSite:
    """A site answering a page of 2 MiB: announced (Content-Length) or streamed."""

    def __init__(self, *, announced: bool) -> None:
        self.app = FastAPI()
        self.app.add_api_route("/site/tracking/changes", self._page if announced else self._stream)

    def _page(self) -> Response:
        return Response(b'{"rows": ["' + b"x" * 2**21 + b'"]}', media_type="application/json")

    def _stream(self) -> StreamingResponse:
        def body() -> Iterator[bytes]:
            yield b'{"rows": ["'
            for _ in range(32):
                yield b"x" * 2**16
            yield b'"]}'

        return StreamingResponse(body(), media_type="application/json")


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "streamed"])
def test_a_page_larger_than_its_bound_is_not_read_whole(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, announced: bool
) -> None:
    """Breaker pass (seventh): a 400 MB answer was read into serve's memory (980 MB at its
    peak) before it was found not to be a page. An answer stops being read past the bound
    (``site_requests.MAX_PAGE_BYTES``, 1 MiB here)."""
    monkeypatch.setattr(reconciliation, "MAX_PAGE_BYTES", 2**20)
    site = OversizedSite(announced=announced)
    with contextlib.ExitStack() as stack:
        oversized = stack.enter_context(serving(site.app))
        sites = [site_entry("oversized", oversized, token="oversized-agent-token-0123456789")]
        settings = central_settings(database_url, tmp_path / "central", sites)
        _url, app, _engine = stack.enter_context(running_central(settings))
        [result] = app.state.reconciliation.run_pass_now()
    assert result.error is not None
    assert "answered more than a page of the pull contract" in result.error
    assert "1048576" in result.error


class SlowSite:
    """A site whose every page waits until the test lets it answer."""

    def __init__(self, agent: SiteAgent) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.app = FastAPI()
        self._agent = agent
        self.app.add_api_route("/site/tracking/changes", self._changes)

    def _changes(self, limit: int = 500) -> dict:
        self.entered.set()
        self.release.wait(60)
        rows, more = self._agent.store.changes(None, None, limit)
        return {"rows": [state_document(r) for r in rows], "more_available": more}


def test_the_api_answers_during_a_slow_pass_and_a_second_trigger_starts_nothing(
    database_url: str, tmp_path: Path
) -> None:
    agent = SiteAgent(agent_settings(tmp_path))
    slow = SlowSite(agent)
    try:
        seed_site_rows(agent, 5, T)
        with contextlib.ExitStack() as stack:
            stack.callback(slow.release.set)
            slow_url = stack.enter_context(serving(slow.app))
            settings = central_settings(
                database_url, tmp_path / "central", [site_entry("plant-7", slow_url)]
            )
            central_url, app, engine = stack.enter_context(running_central(settings))
            started = httpx.post(
                f"{central_url}/api/sites/plant-7/reconcile",
                headers=OPERATOR,
                timeout=TEST_CLIENT_TIMEOUT,
            )
            assert started.status_code == 202
            assert slow.entered.wait(30)
            # The pass waits on the site; the API, and telemetry ingest, answer meanwhile.
            assert (
                httpx.get(
                    f"{central_url}/api/sites", headers=READER, timeout=TEST_CLIENT_TIMEOUT
                ).status_code
                == 200
            )
            assert (
                httpx.get(
                    f"{central_url}/api/errors", headers=READER, timeout=TEST_CLIENT_TIMEOUT
                ).status_code
                == 200
            )
            kpis = httpx.get(
                f"{central_url}/api/site-calls/kpis", headers=READER, timeout=TEST_CLIENT_TIMEOUT
            )
            assert kpis.status_code == 200
            packet = _packet()
            ingest = httpx.post(
                f"{central_url}/api/site-calls/telemetry",
                json=[packet],
                headers=as_site("plant-7"),
                timeout=TEST_CLIENT_TIMEOUT,
            )
            assert ingest.status_code == 200
            assert packet["tracked_operation_id"] in central_rows(engine)
            second = httpx.post(
                f"{central_url}/api/sites/plant-7/reconcile",
                headers=OPERATOR,
                timeout=TEST_CLIENT_TIMEOUT,
            )
            assert second.status_code == 409
            assert app.state.reconciliation.running
            slow.release.set()
            eventually(lambda: not app.state.reconciliation.running, what="the pass ends")
            assert len(central_rows(engine)) == 6
    finally:
        agent.close()


def _packet() -> dict:
    now = datetime.now(UTC).isoformat()
    return {
        "tracked_operation_id": str(uuid.uuid4()),
        "channel": "ApiOutbound",
        "target": "https://erp.example/x",
        "source_site": "plant-7",
        "status": "Submitted",
        "created_at_utc": now,
        "updated_at_utc": now,
    }


def test_a_central_restart_resumes_from_the_stored_cursor(
    database_url: str, tmp_path: Path
) -> None:
    listener = loopback_listener()
    sites = [site_entry("plant-7", url_of(listener))]
    settings = central_settings(
        database_url, tmp_path / "central", sites, batch_size=500, max_pages_per_pass=1
    )
    with running_agent(agent_settings(tmp_path), listener) as agent:
        ids = seed_site_rows(agent, 1000, T)
        with running_central(settings) as (_url, app, engine):
            (first,) = app.state.reconciliation.run_pass_now()
            assert first.rows == 500 and len(central_rows(engine)) == 500
        # A new central process on the same store: its pass continues, it does not restart.
        with running_central(settings) as (_url, app, engine):
            (second,) = app.state.reconciliation.run_pass_now()
            assert second.rows == 500
            assert set(central_rows(engine)) == set(ids)


def test_reconcile_on_demand_needs_a_known_site_and_an_operator(
    database_url: str, tmp_path: Path
) -> None:
    with one_site(database_url, tmp_path) as (_agent, central_url, _app, _engine):
        assert (
            httpx.post(
                f"{central_url}/api/sites/nowhere/reconcile",
                headers=OPERATOR,
                timeout=TEST_CLIENT_TIMEOUT,
            ).status_code
            == 404
        )
        assert (
            httpx.post(
                f"{central_url}/api/sites/plant-7/reconcile",
                headers=READER,
                timeout=TEST_CLIENT_TIMEOUT,
            ).status_code
            == 403
        )


def test_of_two_central_processes_one_runs_the_scheduled_passes(
    database_url: str, tmp_path: Path
) -> None:
    closed = loopback_listener()
    sites = [site_entry("plant-7", url_of(closed))]
    closed.close()
    settings = central_settings(
        database_url,
        tmp_path / "central",
        sites,
        interval=timedelta(milliseconds=50),
        probe_interval=timedelta(milliseconds=50),
    )
    engine = create_store_engine(settings.effective_database_url)
    upgrade_database(engine)
    services = [ReconciliationService(settings, engine, owner=o) for o in ("one", "two")]
    passes = {"one": 0, "two": 0}
    for owner, service in zip(("one", "two"), services, strict=True):
        original = service.reconciler.run_pass

        def counted(sites=None, owner=owner, original=original):  # type: ignore[no-untyped-def]
            passes[owner] += 1
            return original(sites)

        service.reconciler.run_pass = counted  # type: ignore[method-assign]

    async def both() -> None:
        tasks = [asyncio.create_task(service.run()) for service in services]
        while passes["one"] + passes["two"] < 5:
            await asyncio.sleep(0.01)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        asyncio.run(both())
        assert sorted(passes.values())[0] == 0  # the one without the lease never ran one
    finally:
        engine.dispose()


def test_a_site_coming_back_is_reconciled_before_the_next_interval(
    database_url: str, tmp_path: Path
) -> None:
    port_holder = loopback_listener()
    port = port_holder.getsockname()[1]
    port_holder.close()  # the site is down: nothing listens on its port
    settings = central_settings(
        database_url,
        tmp_path / "central",
        [site_entry("plant-7", f"http://127.0.0.1:{port}")],
        interval=timedelta(hours=1),
        probe_interval=timedelta(milliseconds=50),
    )
    with running_central(settings) as (_url, app, engine):
        service = app.state.reconciliation
        stop = threading.Event()

        async def scheduled() -> None:
            task = asyncio.create_task(service.run())
            await asyncio.to_thread(stop.wait)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        runner = threading.Thread(target=asyncio.run, args=(scheduled(),), daemon=True)
        runner.start()
        try:
            eventually(
                lambda: any(r.error for r in service.last_results), what="a failed first pass"
            )
            offline = SiteAgent(agent_settings(tmp_path))  # calls made while it was down
            ids = seed_site_rows(offline, 3, T)
            offline.close()
            listener = listen("127.0.0.1", port)
            with running_agent(agent_settings(tmp_path), listener):
                eventually(
                    lambda: set(central_rows(engine)) == set(ids), what="the site reconciled"
                )
                eventually(
                    lambda: site_state(engine, "plant-7").reachable, what="the pass recorded"
                )
        finally:
            stop.set()
            runner.join(30)


def test_rows_no_store_can_hold_are_kept_as_rejected_and_the_pass_goes_on(
    database_url: str, tmp_path: Path
) -> None:
    # A page holding rows whose times leave years 1-9999 in UTC or whose details_json is
    # nested past any parser: each is kept whole, its neighbours land, the cursor moves.
    def row(n: int, **fields: object) -> dict:
        data = {
            "tracked_operation_id": str(uuid.UUID(int=n)),
            "channel": "DbOutbound",
            "target": "erp.stock",
            "source_site": "odd",
            "status": "Attempted",
            "created_at_utc": T.isoformat(),
            "updated_at_utc": (T + timedelta(seconds=n)).isoformat(),
        }
        return {**data, **fields}

    deep = row(3)
    deep["audit_event"] = {
        "event_id": str(uuid.UUID(int=99)),
        "occurred_at_utc": T.isoformat(),
        "actor": "a",
        "action": "b",
        "outcome": "Success",
        "category": "c",
        "details_json": "[" * 5000,
    }
    page = [
        row(1),
        row(2, created_at_utc="0001-01-01T00:00:00+01:00"),
        deep,
        row(4, updated_at_utc="9999-12-31T23:59:59-01:00"),
        row(5),
    ]
    odd = FastAPI()

    @odd.get("/site/tracking/changes")
    def changes(limit: int = 500) -> JSONResponse:
        return JSONResponse({"rows": page, "more_available": False})

    with contextlib.ExitStack() as stack:
        url = stack.enter_context(serving(odd))
        settings = central_settings(database_url, tmp_path / "central", [site_entry("odd", url)])
        _central, app, engine = stack.enter_context(running_central(settings))
        (result,) = app.state.reconciliation.run_pass_now()
        assert result.error is None
        assert set(central_rows(engine)) == {str(uuid.UUID(int=1)), str(uuid.UUID(int=5))}
        reasons = sorted(reason.split(":")[0] for _, reason in rejected_packets(engine))
        assert reasons == ["audit_event.details_json", "created_at_utc", "updated_at_utc"]
        state = site_state(engine, "odd")
        assert state.cursor_tracked_operation_id == str(uuid.UUID(int=5))


def test_a_site_reached_for_the_first_time_is_not_said_to_answer_again(
    database_url: str, tmp_path: Path
) -> None:
    """The event log tells a site's first answer from its return after a failure."""
    from controlroom.db.tables import event_log_items
    from controlroom.sitecalls.reconciliation import Reconciler

    up = {"now": False}
    site = FastAPI()

    @site.get("/site/tracking/changes")
    def changes() -> JSONResponse:
        if not up["now"]:
            return JSONResponse({"detail": "down"}, status_code=503)
        return JSONResponse({"rows": [], "more_available": False})

    engine = create_store_engine(database_url)
    upgrade_database(engine)
    try:
        with serving(site) as url:
            settings = central_settings(database_url, tmp_path, [site_entry("plant-7", url)])
            reconciler = Reconciler(settings, engine)
            (configured,) = settings.sites
            for answers in (False, True, False, True):
                up["now"] = answers
                reconciler.reconcile_site(configured)
        with engine.connect() as conn:
            said = conn.execute(
                sa.select(event_log_items.c.description)
                .where(event_log_items.c.event_type == "SiteReachable")
                .order_by(event_log_items.c.raised_at)
            ).scalars()
            assert list(said) == [
                "Site plant-7 answers reconciliation",
                "Site plant-7 answers reconciliation again",
            ]
    finally:
        engine.dispose()
