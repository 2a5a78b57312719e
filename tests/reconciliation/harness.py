"""Central and site agents on loopback for the reconciliation and relay tests: real HTTP
between them (uvicorn on free ports), central on the provider under test."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from controlroom.app import create_app
from controlroom.config import ConfiguredSite, Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import audit_log, rejected_telemetry, site_calls
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.site import SiteAgent, SiteService, SiteSettings
from controlroom.site.lifecycle import CallState
from controlroom.site.store import STATE_COLUMNS, tracked_operations
from controlroom.site.telemetry import state_document
from controlroom.sitecalls.queries import SITE_CALL_STAMPS, with_stamps
from controlroom.telemetry.stamps import Stamp, stamp_values
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.site.http import loopback_listener, serving, url_of

OPERATOR_TOKEN = "operator-token-0123456789"
READER_TOKEN = "reader-token-0123456789ab"
SITE_TOKEN = "site-agent-token-0123456789"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
READER = {"Authorization": f"Bearer {READER_TOKEN}"}


def eventually(check: Callable[[], Any], *, timeout: float = 60.0, what: str = "") -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds
    (a bound on a hang, not an assertion about speed)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what or check}")
        time.sleep(0.05)


def central_settings(
    database_url: str, data_dir: Path, sites: list[ConfiguredSite], **reconciliation: Any
) -> Settings:
    """Central's settings; a site may take ``TEST_CLIENT_TIMEOUT`` to answer unless the
    test sets ``request_timeout`` itself (a test of that timeout)."""
    reconciliation = {"request_timeout": TEST_CLIENT_TIMEOUT, **reconciliation}
    return Settings(
        data_dir=data_dir,
        database_url=database_url,
        auth_tokens=[
            {"name": "alice", "token": OPERATOR_TOKEN, "role": "operator"},
            {"name": "rita", "token": READER_TOKEN, "role": "reader"},
        ],
        sites=sites,
        reconciliation=reconciliation,
    )


def central_token_of(site_id: str) -> str:
    """The token a test site's agent posts its telemetry with (each site its own)."""
    return f"{site_id}-telemetry-token-0123456789"


def as_site(site_id: str) -> dict[str, str]:
    """The headers of a request made by ``site_id``'s agent."""
    return {"Authorization": f"Bearer {central_token_of(site_id)}"}


def site_entry(
    site_id: str, url: str, *, token: str | None = SITE_TOKEN, telemetry_token: bool = True
) -> ConfiguredSite:
    """The site at ``url`` with central's secret ``token``; with its telemetry token
    (``central_token_of``) unless ``telemetry_token`` is false (a console test on the open
    loopback API, posting for sites it did not configure)."""
    central_token = central_token_of(site_id) if telemetry_token else None
    return ConfiguredSite(id=site_id, base_url=url, token=token, central_token=central_token)


@contextlib.contextmanager
def running_central(
    settings: Settings, listener: Any = None
) -> Iterator[tuple[str, FastAPI, sa.Engine]]:
    """Central's API over a migrated store, on ``listener`` (a free loopback port by
    default)."""
    engine = create_store_engine(settings.effective_database_url)
    upgrade_database(engine)
    app = create_app(settings, engine, FileSystemBodyStore(settings.body_dir))
    try:
        with serving(app, listener) as url:
            yield url, app, engine
    finally:
        engine.dispose()


@contextlib.contextmanager
def running_agent(settings: SiteSettings, listener: Any = None) -> Iterator[SiteAgent]:
    """A site agent (API, retry loop, outbox) in a thread on ``listener``."""
    listener = listener or loopback_listener()
    agent = SiteAgent(settings)
    service = SiteService(agent)
    thread = threading.Thread(target=asyncio.run, args=(service.run(listener),), daemon=True)
    thread.start()
    try:
        eventually(lambda: service.server.started or not thread.is_alive(), what="agent start")
        assert thread.is_alive(), "the agent stopped at start"
        agent.url = url_of(listener)  # type: ignore[attr-defined]
        yield agent
    finally:
        service.stop()
        thread.join(30)
        agent.close()
        listener.close()


def central_rows(engine: sa.Engine) -> dict[str, dict[str, Any]]:
    """Central's mirror, by id, in the fields a site reports."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(site_calls)).all()
    return {
        row.tracked_operation_id: _comparable(with_stamps(row, SITE_CALL_STAMPS)) for row in rows
    }


def site_rows(agent: SiteAgent) -> dict[str, dict[str, Any]]:
    """The site's tracking store, by id, in the same fields."""
    return {
        state.tracked_operation_id: _comparable(_fields(state)) for state in agent.store.states()
    }


def _fields(state: CallState) -> dict[str, Any]:
    return {name: getattr(state, name) for name in STATE_COLUMNS}


def _comparable(row: dict[str, Any]) -> dict[str, Any]:
    row.pop("ingested_at_utc", None)
    row["status"] = str(row["status"])
    return row


def audit_events(engine: sa.Engine, **where: Any) -> list[dict[str, Any]]:
    query = sa.select(audit_log)
    for name, value in where.items():
        query = query.where(audit_log.c[name] == value)
    with engine.connect() as conn:
        return [dict(row) for row in conn.execute(query).mappings()]


def rejected_packets(engine: sa.Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        query = sa.select(rejected_telemetry.c.source, rejected_telemetry.c.reason)
        return [tuple(row) for row in conn.execute(query)]


def seed_site_rows(
    agent: SiteAgent, count: int, stamp: datetime | Stamp, *, start: int = 0, apart: int = 0
) -> list[str]:
    """``count`` Delivered calls in the site's store stamped from ``stamp``, each ``apart``
    100 ns after the one before (0: all share it, a burst or a legacy clock), written as
    the store writes them; returns their ids."""
    first = stamp if isinstance(stamp, Stamp) else Stamp.of(stamp)
    ids = [str(uuid.UUID(int=start + n + 1)) for n in range(count)]
    stamps = [Stamp.from_ticks(first.ticks + n * apart) for n in range(count)]
    rows = [
        {
            "tracked_operation_id": ident,
            "channel": "DbOutbound",
            "target": "erp.stock",
            "source_site": agent.settings.site_id,
            "source_node": agent.settings.node,
            "status": "Delivered",
            "retry_count": 0,
            "last_error": None,
            "http_status": None,
            **stamp_values("created_at", at),
            **stamp_values("updated_at", at),
            **stamp_values("terminal_at", at),
            "epoch": 0,
            "operation": "http",
            "payload_json": "null",
            "next_attempt_at_utc": None,
            "claimed_by": None,
        }
        for ident, at in zip(ids, stamps, strict=True)
    ]
    with agent.store.engine.begin() as conn:
        conn.execute(sa.insert(tracked_operations), rows)
    return ids


def legacy_site_app(agent: SiteAgent) -> FastAPI:
    """A site agent that predates ``after_id``: it ignores it and answers from ``since``
    inclusive."""
    app = FastAPI()

    @app.get("/site/tracking/changes")
    def changes(since: str | None = None, limit: int = 500) -> dict[str, Any]:
        rows, more = agent.store.changes(since and Stamp.parse(since), None, limit)
        return {"rows": [state_document(row) for row in rows], "more_available": more}

    return app


class TricklingSite:
    """A site that answers 200 at once, then its body a byte every 0.2 s until
    ``release`` (at most a minute): each read comes well within any timeout, the whole
    answer within none. Its answer is a valid page and a valid Applied, in the end.
    ``requests`` counts what it was asked."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.requests = 0
        self.app = FastAPI()
        self.app.add_api_route("/site/tracking/changes", self._answer, methods=["GET"])
        self.app.add_api_route("/site/tracking/{call}/{command}", self._answer, methods=["POST"])

    async def _answer(self) -> StreamingResponse:
        self.requests += 1

        async def body() -> AsyncIterator[bytes]:
            yield b'{"rows": ['
            for _ in range(300):
                if self.release.is_set():
                    break
                yield b" "
                await asyncio.sleep(0.2)
            yield b'], "more_available": false, "outcome": "Applied"}'

        return StreamingResponse(body(), media_type="application/json")
