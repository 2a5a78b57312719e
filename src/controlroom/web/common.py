"""What every console page and action uses: the templates, who is asking (``viewer``,
``actor``, and their ``Viewer``/``Actor`` dependencies), the query parameters the lists
share, the store (``engine_of``), keyset pages (``refusing_bad_cursor``), the KPI tiles'
context (``kpi_tiles``), rendering and redirects. The routers (``pages``, ``actions``,
``sitecall_pages``, ``imports_and_events``, ``notification_pages``) import these;
``console`` mounts the routers. This module imports no router, so the imports run one way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final

import jinja2
import sqlalchemy as sa
from fastapi import Depends, HTTPException, Query, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from controlroom import __version__
from controlroom.config import Settings
from controlroom.db.keyset import BadCursor
from controlroom.errors.retries.outcomes import failed_again_text
from controlroom.http.auth import ANONYMOUS, ROLE_RANK
from controlroom.runtime.wire_text import escape_wire_text
from controlroom.telemetry.stamps import Stamp
from controlroom.web import filters
from controlroom.web.assets import StaticAssets
from controlroom.web.flash import Flash, clear_flash, read_flash, set_flash
from controlroom.web.session import (
    COOKIE_NAME,
    CSRF_FIELD,
    CSRF_HEADER,
    Session,
    SessionSigner,
    csrf_matches,
    mask_csrf_token,
)

WEB_DIR: Final = Path(__file__).parent


def _printable(value: Any) -> Any:
    """Every text a page prints with the bytes that were not UTF-8 escaped (``\\xff``):
    a lone surrogate from the wire would fail the whole page's encoding
    (docs/decisions.md "Headers that are not UTF-8 make a failed import")."""
    return escape_wire_text(value) if type(value) is str else value


# Autoescape everything: every value from a message is text, never markup.
templates = Jinja2Templates(
    env=jinja2.Environment(
        loader=jinja2.FileSystemLoader(WEB_DIR / "templates"),
        autoescape=True,
        finalize=_printable,
    )
)
filters.install(templates.env)
# Hashed once at start: templates name static files by {{ static_url('console.css') }}.
ASSETS: Final = StaticAssets(WEB_DIR / "static")
templates.env.globals["static_url"] = ASSETS.url
# The event log and the groups page word a retry's outcome alike.
templates.env.globals["failed_again_text"] = failed_again_text

NavEntry = tuple[str, str]  # (label, path)
EXTRA_NAV: list[NavEntry] = []
"""Pages other features add to the navigation (site calls, audit log, failed imports,
event log): each feature appends ``(label, path)`` when its page exists."""


class SignInRequired(Exception):
    """The page needs a session and there is none: redirect to the sign-in page."""


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


def engine_of(request: Request) -> sa.Engine:
    """The store's engine."""
    engine: sa.Engine = api_state(request).engine
    return engine


Viewer = Annotated[Session, Depends(viewer)]
"""A page's session (``viewer``)."""
Actor = Annotated[Session, Depends(actor)]
"""An operator's session that sent a state-changing request (``actor``)."""
Text = Annotated[str, Query(max_length=1024)]
"""A filter's text ("" when not given)."""
After = Annotated[str, Query(max_length=500)]
"""A keyset page's cursor ("" on the first page)."""
PAGE_SIZE: Final = 50
"""Rows of a list page."""


@contextmanager
def refusing_bad_cursor() -> Iterator[None]:
    """Around reading a keyset page: a cursor this service did not hand out is a 400
    naming ``after``."""
    try:
        yield
    except BadCursor as exc:
        raise HTTPException(400, f"after: {exc}") from None


def kpi_tiles(
    kpis: Mapping[str, float | int | None], settings: Settings, now: datetime
) -> dict[str, Any]:
    """The context of a KPI tiles macro: ``kpis`` (by metric name, as measured at
    ``now``), the interval and stuck threshold their labels name, and ``now``."""
    return {
        "kpis": kpis,
        "interval": settings.kpi.interval,
        "stuck_threshold": settings.kpi.stuck_threshold,
        "now": now,
    }


# --- rendering ----------------------------------------------------------------------------
def render(
    request: Request, template: str, context: dict[str, Any] | None = None, status: int = 200
) -> Response:
    """``template`` with ``context`` plus what every page needs (the session, its CSRF
    token masked for this answer, whether the viewer may act, the navigation) and, on a
    whole page (a fragment's name starts with ``_``), the outcome of the action that
    redirected here (``flash``), shown once: the answer clears it."""
    session: Session | None = getattr(request.state, "session", None)
    flash = _take_flash(request, session) if not template.startswith("_") else None
    may_act = session is not None and ROLE_RANK[session.principal.role] >= ROLE_RANK["operator"]
    full = {
        "session": session,
        "csrf_token": mask_csrf_token(session.csrf_token) if session else "",
        "may_act": may_act,
        "signed_in": session is not None and not request.app.state.signer.open,
        "extra_nav": EXTRA_NAV,
        "version": __version__,
        "flash": flash,
        **(context or {}),
    }
    response = templates.TemplateResponse(request, template, full, status_code=status)
    if flash is not None:
        clear_flash(response)
    return response


def _take_flash(request: Request, session: Session | None) -> Flash | None:
    if session is None:
        return None
    signer: SessionSigner = request.app.state.signer
    return read_flash(request, signer.flash_key(session))


def redirect(path: str) -> Response:
    """303 to a console path (after a POST: the browser GETs the page again)."""
    return RedirectResponse(path, status_code=303)


def redirect_with(request: Request, path: str, flash: Flash) -> Response:
    """303 to ``path`` carrying ``flash``, the action's outcome, for the page to show
    once (docs/decisions.md "Console actions answer with a redirect"). The request
    must have passed ``actor`` (its session signs the flash)."""
    response = redirect(path)
    signer: SessionSigner = request.app.state.signer
    set_flash(response, request, signer.flash_key(request.state.session), flash)
    return response


def safe_next(target: str) -> str:
    """A console path to return to after signing in; anything else (another site,
    ``//host``, a scheme) becomes ``/``."""
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


def form_instant(field: str, value: str) -> datetime | None:
    """A ``datetime-local`` form value (read as UTC) or an ISO 8601 instant; ``None``
    when empty. Raises ``HTTPException`` 400 naming ``field``."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise HTTPException(
            400, f"{field}: not a date and time (YYYY-MM-DDTHH:MM[:SS], UTC)"
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def form_stamp(field: str, value: str) -> Stamp | None:
    """``form_instant`` as a stamp with no 100 ns part, for the filters that read a site's
    stamps (``telemetry.stamps``). Raises ``HTTPException`` 400 naming ``field``."""
    instant = form_instant(field, value)
    return None if instant is None else Stamp.of(instant)


def notice_count(text: str) -> int:
    """A count from a notice's link: ASCII digits, at most 18 of them, else 0
    (``str.isdigit`` admits ``²``, which ``int`` refuses, and ``int`` refuses more than
    4,300 digits)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else 0
