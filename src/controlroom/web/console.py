"""The operator console: server-rendered pages (Jinja2) with htmx, served at ``/``.

``install_console(app)`` makes the console the API app's fallback, an ASGI app of its own
that answers every path no API route matched: the API's bearer-token dependency does not
apply to it, and the console authenticates by its session cookie instead (``session.py``),
with the same tokens and roles. Nothing here weakens the API: ``/api/...`` stays the API's, and an
``/api/...`` path the API does not know still answers the API's JSON 404.

Safety (docs/decisions.md "The console renders message data as text"): every value from a message is
rendered as text (Jinja2 autoescape, never ``|safe`` on message data); every answer carries a
Content-Security-Policy without inline script; every state-changing request needs the session's CSRF
token and the ``operator`` role (a reader sees no action buttons, and the server refuses them
anyway).
"""

from __future__ import annotations

from typing import Final
from urllib.parse import urlencode

import sqlalchemy as sa
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint

from controlroom.db.errors import classify_store_error
from controlroom.exceptions import ErrorKind
from controlroom.runtime.wire_text import escape_wire_text
from controlroom.web import (
    actions,
    imports_and_events,
    notification_pages,
    pages,
    sitecall_pages,
)
from controlroom.web.assets import HashedStaticFiles
from controlroom.web.common import ASSETS, SignInRequired, redirect, render
from controlroom.web.session import Session, SessionSigner, set_session_cookie

CONSOLE_CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
# Swagger UI sets inline styles (not scripts); it still runs only the package's own files.
DOCS_CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)


def install_console(app: FastAPI) -> None:
    """Serve the console from ``app`` for every path no route of ``app`` matches."""
    console = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    console.state.api = app.state
    console.state.signer = SessionSigner(app.state.auth)
    console.add_middleware(_SecurityHeaders)
    console.mount("/static", HashedStaticFiles(ASSETS), name="static")
    console.include_router(pages.router)
    console.include_router(actions.router)
    console.include_router(sitecall_pages.router)
    console.include_router(imports_and_events.router)
    console.include_router(notification_pages.router)
    console.add_exception_handler(SignInRequired, _to_sign_in)
    console.add_exception_handler(HTTPException, _error_page)
    console.add_exception_handler(RequestValidationError, _invalid_request_page)
    console.add_exception_handler(404, _not_found)
    console.add_exception_handler(sa.exc.DBAPIError, _store_error_page)
    console.add_exception_handler(OverflowError, _out_of_range_page)
    console.add_exception_handler(sa.exc.StatementError, _unbindable_page)
    # The console answers what no route of ``app`` matched (Starlette's ``Router.default``,
    # its 404 otherwise): API routes added later still come first, and still need tokens.
    app.router.default = console


class _SecurityHeaders(BaseHTTPMiddleware):
    """CSP and friends on every console answer; sets a new session's cookie."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        docs = request.url.path.rstrip("/").endswith("/docs")
        response.headers.setdefault("content-security-policy", DOCS_CSP if docs else CONSOLE_CSP)
        response.headers.setdefault("x-content-type-options", "nosniff")
        response.headers.setdefault("x-frame-options", "DENY")
        response.headers.setdefault("referrer-policy", "same-origin")
        new: Session | None = getattr(request.state, "new_session", None)
        if new is not None:
            set_session_cookie(response, request, request.app.state.signer, new)
        return response


async def _to_sign_in(request: Request, exc: Exception) -> Response:
    target = request.url.path
    if request.url.query:
        target += "?" + request.url.query
    return redirect("/signin?" + urlencode({"next": target}))


async def _error_page(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if _is_api_path(request):
        return JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)
    return render(
        request,
        "error.html",
        {"status": exc.status_code, "detail": exc.detail},
        status=exc.status_code,
    )


async def _store_error_page(request: Request, exc: Exception) -> Response:
    """A store error no page handled, as the API answers it (``app``): the request's own
    value the store refuses (a NUL in a filter, which PostgreSQL refuses in text) is a
    400 page, a busy or unreachable store a 503 page; anything else stays a 500."""
    kind = classify_store_error(exc)
    if kind is ErrorKind.DATA:
        detail = (
            "The database refused a value of this page's address or form (a NUL character, "
            "or a value longer than its field)."
        )
        return render(request, "error.html", {"status": 400, "detail": detail}, status=400)
    if kind is ErrorKind.TRANSIENT:
        detail = "The database is busy or unreachable; try again."
        page = render(request, "error.html", {"status": 503, "detail": detail}, status=503)
        page.headers["Retry-After"] = "1"
        return page
    raise exc


async def _out_of_range_page(request: Request, exc: Exception) -> Response:
    """A value past what the store can hold (a time beyond year 9999 in UTC): a 400 page."""
    detail = "A value of this page's address or form is out of range."
    return render(request, "error.html", {"status": 400, "detail": detail}, status=400)


async def _unbindable_page(request: Request, exc: Exception) -> Response:
    """SQLAlchemy wraps an ``OverflowError`` it met binding a value in a
    ``StatementError``, which the handler keyed on the error itself never sees."""
    if isinstance(getattr(exc, "orig", None), OverflowError):
        return await _out_of_range_page(request, exc)
    raise exc


async def _invalid_request_page(request: Request, exc: Exception) -> Response:
    """422 as a page naming each parameter at fault (where it is, its name, why), never
    its value: the console's answer where the API answers ``validation_answers``' JSON."""
    assert isinstance(exc, RequestValidationError)
    problems = [
        {
            "where": _PLACES.get(str(error["loc"][0]), str(error["loc"][0])),
            "field": escape_wire_text(".".join(str(part) for part in error["loc"][1:])),
            "why": error["msg"],
        }
        for error in exc.errors()
    ]
    detail = "This page cannot be shown for what the address or form asked."
    return render(
        request, "error.html", {"status": 422, "detail": detail, "problems": problems}, status=422
    )


_PLACES: Final = {"query": "Query parameter", "path": "Path part", "body": "Form field"}


async def _not_found(request: Request, exc: Exception) -> Response:
    # Paths below /api the API did not match: the API's own 404, not a console page.
    if _is_api_path(request):
        return JSONResponse({"detail": "Not Found"}, 404)
    return render(request, "error.html", {"status": 404, "detail": "No such page."}, status=404)


def _is_api_path(request: Request) -> bool:
    path = request.url.path
    return path == "/api" or path.startswith("/api/")
