"""The one place the HTTP application is assembled: the API's routers under ``/api``
(``controlroom.api``), the console as their fallback (``controlroom.web``), the
middleware and the error handlers; dependencies on ``app.state``. Above both halves,
so neither the API nor the console imports the other."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Protocol

import sqlalchemy as sa
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette_compress import CompressMiddleware

from controlroom import __version__
from controlroom.api import (
    archive,
    auth,
    compat,
    configuration,
    endpoints,
    errors,
    eventlog,
    failed_imports,
    guard,
    health,
    limits,
    metrics,
    notifications,
    recoverability,
    redirects,
    retries,
    search,
    sitecalls,
    sites,
)
from controlroom.api.parameters import no_nul_in_parameters
from controlroom.config import Settings
from controlroom.db.errors import classify_store_error
from controlroom.errors.ingest.bodies import BodyStore
from controlroom.exceptions import ErrorKind
from controlroom.http.auth import token_table
from controlroom.runtime.intake_health import IntakeHealth
from controlroom.sitecalls.reconciliation import ReconciliationService
from controlroom.transport.base import Transport
from controlroom.validation_answers import install_validation_answer
from controlroom.web import install_console


class Wakeable(Protocol):
    """What the app wakes when a retry request created batches: the retry processor, or
    the intake workers that run it (``controlroom.workers``)."""

    def wake(self) -> None: ...


COMPRESS_MINIMUM_BYTES: Final = 1024


def create_app(
    settings: Settings,
    engine: sa.Engine,
    body_store: BodyStore,
    *,
    health_checks: Mapping[str, health.HealthCheck] | None = None,
    transport: Transport | None = None,
    retry_processor: Wakeable | None = None,
    reconciliation: ReconciliationService | None = None,
    on_telemetry_written: Callable[[], None] | None = None,
    intakes: Sequence[IntakeHealth] = (),
    exposition: Callable[[], bytes] | None = None,
) -> FastAPI:
    """The HTTP API over a migrated store ``engine`` and its ``body_store``.

    ``health_checks`` maps each part ``GET /api/health`` reports (``"database"``,
    ``"broker"``) to its check; by default only the database is checked. The process
    that serves the app owns ``engine`` and ``body_store`` and closes them; routers find
    them, and ``settings``, on ``app.state``. ``transport`` sends edited messages (edit
    and retry answers 503 without one); ``retry_processor``, when given, is woken as soon
    as a retry request created batches. ``reconciliation`` runs on-demand passes (a
    fresh one, without its schedule, by default). ``on_telemetry_written`` is called
    after a telemetry request stored a packet (the KPI sampler's cue). ``intakes``: the
    running intakes' health, which ``GET /api/health`` reports as ``"intake"`` (none:
    not reported). ``exposition``, when given, answers the process's own metrics for
    ``/metrics`` (the intake workers': ``controlroom.workers``); else the default registry.
    """
    # Authentication covers every route, those added later too (auth.py: open routes).
    # /docs is the console's (Swagger UI from the package, offline); no CDN-based ReDoc.
    app = FastAPI(
        title="Controlroom",
        version=__version__,
        dependencies=[Depends(auth.authorize)],
        docs_url=None,
        redoc_url=None,
    )
    app.state.auth = token_table(settings)
    app.state.settings = settings
    app.state.engine = engine
    app.state.body_store = body_store
    app.state.transport = transport
    app.state.retry_processor = retry_processor
    app.state.reconciliation = reconciliation or _reconciliation(settings, engine)
    app.state.on_telemetry_written = on_telemetry_written
    app.state.intakes = list(intakes)
    app.state.exposition = exposition
    app.state.health_checks = dict(
        health_checks if health_checks is not None else {"database": health.database_check(engine)}
    )
    for router, prefix in _ROUTERS:
        app.include_router(router, prefix=prefix, dependencies=_API_PARAMETERS[prefix])
    app.state.route_templates = metrics.route_templates(_ROUTERS)
    # Inside CORS: a refused cross-site request gets no CORS headers either. Outermost of
    # these three: the size limit, then authentication, both before a body is read.
    app.add_middleware(guard.CrossSiteGuard, allowed_origins=settings.cors_allowed_origins)
    app.add_middleware(limits.AuthenticateFirst)
    app.add_middleware(limits.BodySizeLimit, max_bytes=settings.max_request_body_size)
    compat.install_middleware(app, settings)
    app.add_middleware(metrics.RequestMetrics)
    # Outermost: zstd, br or gzip, as the client asks, for JSON, HTML, CSS and JS above
    # about a kilobyte (smaller ones gain less than the headers cost). The console's pages
    # carry the CSRF token masked per answer for that (docs/decisions.md "Compressed
    # answers and the CSRF token").
    app.add_middleware(CompressMiddleware, minimum_size=COMPRESS_MINIMUM_BYTES)
    app.add_exception_handler(RequestValidationError, limits.validation_error)
    app.add_exception_handler(sa.exc.DBAPIError, _store_error)
    app.add_exception_handler(OverflowError, _out_of_range)
    app.add_exception_handler(sa.exc.StatementError, _unbindable)
    install_validation_answer(app)
    # The console answers every path no API route takes (/, /messages, /docs, /static).
    install_console(app)
    return app


_API_PARAMETERS = {"/api": [Depends(no_nul_in_parameters)], "": []}
"""Checks of every API route's parameters (``api.parameters.no_nul_in_parameters``)."""

# Order matters: recoverability before errors, whose /errors/{id} would otherwise take
# /errors/groups.
_ROUTERS: list[tuple[APIRouter, str]] = [
    (recoverability.router, "/api"),
    (archive.router, "/api"),
    (endpoints.router, "/api"),
    (configuration.router, "/api"),
    (errors.router, "/api"),
    (search.router, "/api"),
    (health.router, "/api"),
    (retries.router, "/api"),
    (redirects.router, "/api"),
    (eventlog.router, "/api"),
    (failed_imports.router, "/api"),
    (metrics.router, ""),
    (compat.router, "/api"),
    (sitecalls.router, "/api"),
    (sites.router, "/api"),
    (notifications.router, "/api"),
]


def _reconciliation(settings: Settings, engine: sa.Engine) -> ReconciliationService:
    return ReconciliationService(settings, engine, owner=str(uuid.uuid4()))


async def _out_of_range(request: Request, exc: Exception) -> Response:
    """A value past what the store can hold (a time beyond year 9999 in UTC) is a 400."""
    return JSONResponse({"detail": f"a value of this request is out of range: {exc}"}, 400)


async def _unbindable(request: Request, exc: Exception) -> Response:
    """A value SQLAlchemy could not bind: it wraps the error (an ``OverflowError`` for a
    time past year 9999 in UTC) in a ``StatementError``, which the handlers keyed on the
    error itself never see. A parameter type should have refused it by name first."""
    orig = getattr(exc, "orig", None)
    if isinstance(orig, OverflowError):
        return await _out_of_range(request, orig)
    raise exc


async def _store_error(request: Request, exc: Exception) -> Response:
    """A store error no route handled: the request's own bad value is a 400, a busy or
    unreachable database a 503 (try again); anything else stays a 500."""
    kind = classify_store_error(exc)
    if kind is ErrorKind.DATA:
        return JSONResponse(
            {
                "detail": "the database refused a value of this request (e.g. a NUL character "
                "or a value longer than its field)"
            },
            status_code=400,
        )
    if kind is ErrorKind.TRANSIENT:
        return JSONResponse(
            {"detail": "the database is busy or unreachable; try again"},
            status_code=503,
            headers={"Retry-After": "1"},
        )
    raise exc
