"""``GET /api/health``: is the process connected to what it needs?

Each part (``database``, ``broker``, ...) is an injected ``HealthCheck``: an async
callable that returns when the part is healthy and raises otherwise. The answer is 200
with every part ``"ok"``, or 503 naming the failing part and why (DESIGN.md "Operational
contract": 200 with the state of the database and broker connections once ready).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

import sqlalchemy as sa
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

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
    results = await asyncio.gather(*(_run_check(checks[name]) for name in names))
    return dict(zip(names, results, strict=True))


async def _run_check(check: HealthCheck) -> str:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
            await check()
    except TimeoutError:
        return f"failing: no answer within {CHECK_TIMEOUT_SECONDS:g} s"
    # Whatever a dependency raises means "unhealthy"; reporting it is this endpoint's job.
    except Exception as exc:
        return f"failing: {type(exc).__name__}: {exc}"
    return OK


@router.get(
    "/health",
    responses={503: {"description": "A part is failing; its value says why."}},
)
async def get_health(request: Request) -> JSONResponse:
    """200 ``{"database": "ok", "broker": "ok"}`` when every part is healthy, else 503
    with the same object, the failing parts' values reading ``"failing: <reason>"``."""
    states = await check_health(request.app.state.health_checks)
    healthy = all(state == OK for state in states.values())
    return JSONResponse(states, status_code=200 if healthy else 503)
