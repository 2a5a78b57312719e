"""Two central processes on one database reconcile a site once: on-demand passes take the
pass lease (the second answers 409), and a pin change is recorded once per transition
across processes (docs/design.md "Reconciliation"); every provider. And a pass that
central's own store blocks leaves the site reachable (PostgreSQL: a lock another
connection holds)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from fastapi import FastAPI

from controlroom.config import AuditSettings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import event_log_items, site_reconciliation
from controlroom.site import SiteAgent, SiteSettings
from controlroom.site.telemetry import state_document
from controlroom.sitecalls.reconciliation import Reconciler
from controlroom.telemetry.stamps import Stamp
from tests.reconciliation.harness import (
    OPERATOR,
    SITE_TOKEN,
    central_settings,
    eventually,
    running_central,
    seed_site_rows,
    site_entry,
)
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.site.http import serving

T = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
WAIT = 60.0  # a bound on a hang, not an assertion about speed


class GatedLegacySite:
    """A site that predates ``after_id`` (it answers from ``since`` inclusive), holding
    600 rows sharing one stamp, so that a pass with pages of 500 pins it. Every first
    page (no ``since``: the start of a pass) waits at ``gate`` before it answers."""

    def __init__(self, agent: SiteAgent, gate: Any) -> None:
        self.first_pages = 0
        self._lock = threading.Lock()
        self.app = FastAPI()

        @self.app.get("/site/tracking/changes")
        def changes(since: str | None = None, limit: int = 500) -> dict[str, Any]:
            if since is None:
                with self._lock:
                    self.first_pages += 1
                gate()
            # The cursor is a 100 ns stamp (seven fractional digits), read as the agent does.
            cursor = Stamp.parse(since) if since is not None else None
            rows, more = agent.store.changes(cursor, None, limit)
            return {"rows": [state_document(row) for row in rows], "more_available": more}


@contextlib.contextmanager
def site_agent(tmp_path: Path) -> Iterator[SiteAgent]:
    agent = SiteAgent(
        SiteSettings(
            site_id="plant-7",
            node="node-a",
            store_path=tmp_path / "plant-7" / "tracking.db",
            token=SITE_TOKEN,
            backoff_base=3600,
            backoff_cap=3600,
        )
    )
    try:
        seed_site_rows(agent, 600, T)
        yield agent
    finally:
        agent.close()


def pin_events(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(event_log_items.c.event_type).where(
                    event_log_items.c.event_type.in_(["SitePinned", "SiteUnpinned"])
                )
            ).scalars()
        )


def test_two_processes_asked_at_once_run_one_pass_and_raise_one_site_pinned(
    database_url: str, tmp_path: Path
) -> None:
    opened = threading.Event()
    with site_agent(tmp_path) as agent:
        site = GatedLegacySite(agent, lambda: opened.wait(WAIT))
        with serving(site.app) as site_url:
            settings = central_settings(
                database_url, tmp_path / "central", [site_entry("plant-7", site_url)]
            )
            with (
                running_central(settings) as (first_url, first, engine),
                running_central(settings) as (second_url, second, _),
            ):
                barrier = threading.Barrier(2, timeout=WAIT)
                answers: dict[str, httpx.Response] = {}

                def ask(url: str) -> None:
                    barrier.wait()
                    answers[url] = httpx.post(
                        f"{url}/api/sites/plant-7/reconcile",
                        headers=OPERATOR,
                        timeout=TEST_CLIENT_TIMEOUT,
                    )

                threads = [threading.Thread(target=ask, args=(u,)) for u in (first_url, second_url)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(WAIT)
                statuses = sorted(answer.status_code for answer in answers.values())
                assert statuses == [202, 409], [answer.text for answer in answers.values()]
                (refused,) = [a for a in answers.values() if a.status_code == 409]
                assert "another central process" in refused.json()["detail"]

                opened.set()
                services = [first.state.reconciliation, second.state.reconciliation]
                eventually(
                    lambda: _pulled(engine) and not any(s.running for s in services),
                    timeout=WAIT,
                    what="the pass to end",
                )
                assert site.first_pages == 1
                assert pin_events(engine) == ["SitePinned"]


def test_a_pin_change_is_recorded_once_when_two_passes_race_past_any_lease(
    database_url: str, tmp_path: Path
) -> None:
    # Past the lease (as if two processes' leases had both been granted): both passes read
    # "not pinned", both end pinned, and the conditional update lets one write the event.
    both_pulling = threading.Barrier(2, timeout=WAIT)
    with site_agent(tmp_path) as agent:
        site = GatedLegacySite(agent, both_pulling.wait)
        with serving(site.app) as site_url:
            sites = [site_entry("plant-7", site_url)]
            settings = central_settings(database_url, tmp_path / "central", sites)
            engines = [create_store_engine(settings.effective_database_url) for _ in range(2)]
            try:
                upgrade_database(engines[0])
                results: list[Any] = []

                def reconcile(engine: sa.Engine) -> None:
                    results.append(Reconciler(settings, engine).reconcile_site(sites[0]))

                threads = [threading.Thread(target=reconcile, args=(e,)) for e in engines]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(WAIT)
                assert [(r.error, r.pinned) for r in results] == [(None, True)] * 2
                assert site.first_pages == 2
                assert pin_events(engines[0]) == ["SitePinned"]
                with engines[0].connect() as conn:
                    assert conn.execute(sa.select(site_reconciliation.c.pinned)).scalar_one()
            finally:
                for engine in engines:
                    engine.dispose()


def _pulled(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(sa.select(site_reconciliation.c.last_pull_at_utc)).scalar() is not None


def test_a_pass_the_store_blocks_leaves_the_site_reachable_and_names_the_store(
    postgresql_url: str, tmp_path: Path
) -> None:
    with site_agent(tmp_path) as agent:
        site = GatedLegacySite(agent, lambda: None)
        with serving(site.app) as site_url:
            settings = central_settings(
                postgresql_url, tmp_path / "central", [site_entry("plant-7", site_url)]
            )
            budgets = AuditSettings(ingest_budget=0.2, row_budget=0.2)
            settings = settings.model_copy(update={"audit": budgets})
            with running_central(settings) as (_, app, engine):
                blocker = engine.connect()
                try:
                    blocker.exec_driver_sql("LOCK TABLE site_calls IN ACCESS EXCLUSIVE MODE")
                    (result,) = app.state.reconciliation.run_pass_now()
                finally:
                    blocker.rollback()
                    blocker.close()
                assert result.error is not None and "central's store" in result.error
                assert "the site answered" in result.error
                assert "SQL" not in result.error and "sqlalche.me" not in result.error
                with engine.connect() as conn:
                    state = conn.execute(sa.select(site_reconciliation)).one()
                assert state.reachable is True
                assert state.last_error == result.error
                assert [s.id for s in app.state.reconciliation.failed_sites()] == ["plant-7"]
                # Unblocked, the next pass goes on from where it was.
                (again,) = app.state.reconciliation.run_pass_now()
                assert again.error is None and again.rows > 0
