"""``GET /api/health``: is the process connected to what it needs?

Each part (``database``, ``broker``, ...) is an injected ``HealthCheck``: an async
callable that returns when the part is healthy and raises otherwise. The answer is 200
with every part ``"ok"``, or 503 naming the failing part and the kind of failure
(docs/design.md "Operational contract": 200 with the state of the database and broker
connections once ready). The route is open (monitoring polls it without a token), so a
failure shows its exception type only; its text, which names hosts, ports and users,
goes to the log (docs/decisions.md "Store errors never carry message data"). ``details``
holds counts an operator watches: ``failed_imports`` (messages kept whole because they
could not be ingested; absent when the database cannot be read) and, when sites are
configured, ``sites``: per site whether it is reachable and pinned and its reconciliation
lag (seconds since its last successful pass). What is wrong with a site (pinned,
unreachable, lagging more than twice ``reconciliation.interval``) is listed in
``warnings``: a warning, not a failure, so the status stays 200 (the process itself is
healthy; ``sitecalls.reconciliation`` ``site_warnings``). So is a store whose vacuum
settings let its counter tables fill with dead rows (PostgreSQL with autovacuum off:
``Provider.vacuum_warnings``), listed first.

When the process ingests (``serve`` with ``ingest_on_serve``), ``intake`` says whether its
intakes store what their queues hold (``runtime.intake_health``): ``"ok"``, or
``"degraded: <reasons>"`` while an intake's writes fail (a full disk or body store, a
read-only database) or its queue has held messages for ``ingestion.stall_seconds``
without a batch stored; ``details.intakes`` has each one's figures. A degraded intake
answers 503, as a failing part does: the service is not doing its work, although it loses
nothing (the messages stay unacknowledged in the queue), and a supervisor that restarts
on 503 restarts it harmlessly (docs/design.md "Operational contract").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from controlroom.config import Settings
from controlroom.db.providers import provider_for
from controlroom.errors.ingest.reimport import count_failed_imports
from controlroom.runtime.intake_health import IntakeHealth, IntakeState
from controlroom.sitecalls.reconciliation import reconciliation_lag, site_states, site_warnings

log = logging.getLogger(__name__)

HealthCheck = Callable[[], Awaitable[None]]
"""Returns when the part is healthy; raises (any exception) when it is not."""

CHECK_TIMEOUT_SECONDS = 5.0
"""A part that has not answered by then counts as failing (a hung connect must not hang
the health endpoint that monitoring polls)."""

OK = "ok"

router = APIRouter(tags=["health"])


def database_check(engine: sa.Engine) -> HealthCheck:
    """A check that runs ``SELECT 1`` on ``engine`` (in a worker thread)."""

    def ping() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    async def check() -> None:
        await run_in_threadpool(ping)

    return check


async def check_health(checks: Mapping[str, HealthCheck]) -> dict[str, str]:
    """Run every check concurrently; ``{part: "ok" | "failing: <reason>"}``."""
    names = list(checks)
    results = await asyncio.gather(*(_run_check(checks[name], name) for name in names))
    return dict(zip(names, results, strict=True))


async def _run_check(check: HealthCheck, name: str = "part") -> str:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
            await check()
    except TimeoutError:
        return f"failing: no answer within {CHECK_TIMEOUT_SECONDS:g} s"
    # Whatever a dependency raises means "unhealthy"; reporting it is this endpoint's job.
    except Exception as exc:
        log.warning("health check of the %s failed: %s: %s", name, type(exc).__name__, exc)
        return f"failing: {type(exc).__name__}"
    return OK


@router.get(
    "/health",
    responses={503: {"description": "A part is failing; its value says why."}},
)
async def get_health(request: Request) -> JSONResponse:
    """200 ``{"database": "ok", "broker": "ok", "details": {"failed_imports": 0}}`` when
    every part is healthy, else 503 with the same object, the failing parts' values
    reading ``"failing: <exception type>"``. With sites configured, ``details.sites``
    (``{site: {"reachable": bool | None, "pinned": bool, "reconciliation_lag_seconds":
    float | None}}``) and, when something is wrong with one or with the store's vacuum
    settings, ``warnings`` (sentences; absent when there are none). While ingesting,
    ``intake``: ``"ok"`` or ``"degraded: <reasons>"`` (then 503), and
    ``details.intakes`` (``{intake: {"queue": str, "waiting_messages": int | None,
    "last_stored_at": ISO 8601 UTC | None, "write_failures": int}}``)."""
    states = await check_health(request.app.state.health_checks)
    healthy = all(state == OK for state in states.values())
    answer: dict[str, object] = dict(states)
    details, warnings = await _details(request.app.state.engine, request.app.state.settings)
    intakes: list[IntakeHealth] = request.app.state.intakes
    if intakes:
        found = await intake_states(intakes, request.app.state.transport)
        reasons = [state.reason for state in found if state.reason is not None]
        answer["intake"] = f"degraded: {'; '.join(reasons)}" if reasons else OK
        healthy = healthy and not reasons
        details["intakes"] = {state.name: _intake_details(state) for state in found}
    answer["details"] = details
    if warnings:
        answer["warnings"] = warnings
    return JSONResponse(answer, status_code=200 if healthy else 503)


async def intake_states(intakes: Sequence[IntakeHealth], transport: Any) -> list[IntakeState]:
    """Each intake's state, after telling it its queue's depth now (a queue that cannot
    answer within ``CHECK_TIMEOUT_SECONDS`` keeps the depth last seen)."""
    for intake in intakes:
        if transport is None:
            break
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
                depth = await transport.queue_depth(intake.queue)
        except Exception as exc:  # the broker check says why
            log.warning("cannot read the depth of %s: %s", intake.queue, exc)
            continue
        intake.observed_depth(depth.messages)
    return [intake.state() for intake in intakes]


def _intake_details(state: IntakeState) -> dict[str, Any]:
    return {
        "queue": state.queue,
        "waiting_messages": state.waiting,
        "last_stored_at": None
        if state.last_stored_at is None
        else state.last_stored_at.isoformat(),
        "write_failures": state.write_failures,
    }


async def _details(engine: sa.Engine, settings: Settings) -> tuple[dict[str, Any], list[str]]:
    def read() -> tuple[dict[str, Any], list[str]]:
        with engine.connect() as conn:
            details: dict[str, Any] = {"failed_imports": count_failed_imports(conn)}
            store_warnings = provider_for(conn).vacuum_warnings(conn)
            if not settings.sites:
                return details, store_warnings
            sites = site_states(conn, settings.sites)
        now = datetime.now(UTC)
        details["sites"] = {
            state.id: {
                "reachable": state.reachable,
                "pinned": state.pinned,
                "reconciliation_lag_seconds": reconciliation_lag(state, now),
            }
            for state in sites
        }
        interval = settings.reconciliation.interval
        return details, store_warnings + [
            w for state in sites for w in site_warnings(state, now, interval)
        ]

    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
            return await run_in_threadpool(read)
    except Exception:  # the database check already says why; the counts are extras
        return {}, []
