"""The operator console: server-rendered pages (Jinja2) with htmx, served at ``/``.

``install_console(app)`` makes the console the API app's fallback, an ASGI app of its own
that answers every path no API route matched: the API's bearer-token dependency does not
apply to it, and the console authenticates by its session cookie instead (``session.py``),
with the same tokens and roles. Nothing here weakens the API: ``/api/...`` stays the API's, and an
``/api/...`` path the API does not know still answers the API's JSON 404.

Safety (issue 12): every value from a message is rendered as text (Jinja2 autoescape,
never ``|safe`` on message data); every answer carries a Content-Security-Policy without
inline script; every state-changing request needs the session's CSRF token and the
``operator`` role (a reader sees no action buttons, and the server refuses them anyway).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

import jinja2
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint

from controlroom import __version__
from controlroom.api.auth import ANONYMOUS, ROLE_RANK
from controlroom.web import filters
from controlroom.web.session import (
    COOKIE_NAME,
    CSRF_FIELD,
    CSRF_HEADER,
    Session,
    SessionSigner,
    csrf_matches,
    set_session_cookie,
)

WEB_DIR: Final = Path(__file__).parent
# Autoescape everything: every value from a message is text, never markup.
templates = Jinja2Templates(
    env=jinja2.Environment(loader=jinja2.FileSystemLoader(WEB_DIR / "templates"), autoescape=True)
)
filters.install(templates.env)

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

NavEntry = tuple[str, str]  # (label, path)
EXTRA_NAV: list[NavEntry] = []
"""Pages other features add to the navigation (site calls, audit log, failed imports,
event log): each feature appends ``(label, path)`` when its page exists."""


class SignInRequired(Exception):
    """The page needs a session and there is none: redirect to the sign-in page."""


def install_console(app: FastAPI) -> None:
    """Serve the console from ``app`` for every path no route of ``app`` matches."""
    # (imported here: the routes need this module's helpers)
    from controlroom.web import actions, imports_and_events, pages, sitecall_pages

    console = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    console.state.api = app.state
    console.state.signer = SessionSigner(app.state.auth)
    console.add_middleware(_SecurityHeaders)
    console.mount("/static", StaticFiles(directory=WEB_DIR / "static"), name="static")
    console.include_router(pages.router)
    console.include_router(actions.router)
    console.include_router(sitecall_pages.router)
    console.include_router(imports_and_events.router)
    console.add_exception_handler(SignInRequired, _to_sign_in)
    console.add_exception_handler(HTTPException, _error_page)
    console.add_exception_handler(404, _not_found)
    # The console answers what no route of ``app`` matched (Starlette's ``Router.default``,
    # its 404 otherwise): API routes added later still come first, and still need tokens.
    app.router.default = console


# --- who is asking ------------------------------------------------------------------------
def viewer(request: Request) -> Session:
    """The session of a page request (a FastAPI dependency). On the open console a
    request without one gets a new anonymous session (its cookie is set on the answer);
    with tokens configured it is sent to the sign-in page."""
    signer: SessionSigner = request.app.state.signer
    session = signer.decode(request.cookies.get(COOKIE_NAME))
    if session is None:
        if not signer.open:
            raise SignInRequired
        session = signer.new_session(ANONYMOUS)
        request.state.new_session = session
    request.state.session = session
    return session


async def actor(request: Request) -> Session:
    """The session of a state-changing request (a dependency): it must carry the
    session's CSRF token (form field or header) and be an ``operator`` at least.

    Raises ``HTTPException`` 403 (no session, a missing or wrong CSRF token, or a role
    too low): the request changes nothing.
    """
    signer: SessionSigner = request.app.state.signer
    session = signer.decode(request.cookies.get(COOKIE_NAME))
    if session is None:
        raise HTTPException(403, "no console session: sign in again")
    presented = request.headers.get(CSRF_HEADER)
    if presented is None:
        form = await request.form()
        field = form.get(CSRF_FIELD)
        presented = field if isinstance(field, str) else None
    if not csrf_matches(session, presented):
        raise HTTPException(403, "the form's CSRF token is missing or wrong: reload the page")
    if not session.principal.may("operator"):
        raise HTTPException(
            403,
            f"{session.principal.name!r} has role {session.principal.role!r}; "
            "this needs role 'operator'",
        )
    request.state.session = session
    return session


def api_state(request: Request) -> Any:
    """The API app's state: ``engine``, ``body_store``, ``transport``, ``settings``..."""
    return request.app.state.api


# --- rendering ----------------------------------------------------------------------------
def render(
    request: Request, template: str, context: dict[str, Any] | None = None, status: int = 200
) -> Response:
    """``template`` with ``context`` plus what every page needs (the session, its CSRF
    token, whether the viewer may act, the navigation)."""
    session: Session | None = getattr(request.state, "session", None)
    may_act = session is not None and ROLE_RANK[session.principal.role] >= ROLE_RANK["operator"]
    full = {
        "session": session,
        "csrf_token": session.csrf_token if session else "",
        "may_act": may_act,
        "signed_in": session is not None and not request.app.state.signer.open,
        "extra_nav": EXTRA_NAV,
        "version": __version__,
        **(context or {}),
    }
    return templates.TemplateResponse(request, template, full, status_code=status)


def redirect(path: str) -> Response:
    """303 to a console path (after a POST: the browser GETs the page again)."""
    return RedirectResponse(path, status_code=303)


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


async def _not_found(request: Request, exc: Exception) -> Response:
    # Paths below /api the API did not match: the API's own 404, not a console page.
    if _is_api_path(request):
        return JSONResponse({"detail": "Not Found"}, 404)
    return render(request, "error.html", {"status": 404, "detail": "No such page."}, status=404)


def _is_api_path(request: Request) -> bool:
    path = request.url.path
    return path == "/api" or path.startswith("/api/")
