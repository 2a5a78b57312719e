"""Bearer-token authentication and role checks, applied to every route of the app.

Tokens come from the settings (``auth_tokens``: name, token, role), looked up in the
token table of ``controlroom.http.auth``. Roles, each with the rights of the ones before
it:

- ``reader``: ``GET``, ``HEAD`` (and ``OPTIONS``);
- ``operator``: any other method (archive, retry, resolve, comment, edit);
- ``admin``: routes that declare ``Depends(require_admin)`` (endpoint deletion).

Answers: 401 with ``WWW-Authenticate: Bearer`` when the token is missing, malformed or
unknown; 403 when the token's role may not do what was asked. Without any configured
operator token the API is open (every caller acts as ``admin``): the embedded default,
which ``serve`` allows on a loopback address only (``ensure_serving_is_protected``).
``/api/health`` stays open so that monitoring needs no token, and
``/api/authentication/configuration`` so that a client can learn whether it needs one.

A site speaks only for itself (docs/design.md "Site credentials"). The paths a site
posts to (``SITE_PATHS``: its telemetry and its notifications) take a site's token only
(``sites[].central_token``): an operator's token there is a 403, whatever its role, and a
site's token anywhere else is a 403. Each packet must name the token's own site
(``refuse_foreign_packets``): one that names another site makes the whole request a 403
and nothing of it is kept. Only when no token of either kind is configured are these
paths open too (the loopback dev mode, ``TokenTable.sites_open``).

Tokens are compared in constant time (``TokenTable.identify``), never logged or echoed; the
caller is named by its token's ``name``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from fastapi import Depends, HTTPException, Request

from controlroom.config import Role, Settings
from controlroom.exceptions import ConfigurationError
from controlroom.http.auth import ANONYMOUS, Caller, Principal, SitePrincipal, TokenTable
from controlroom.runtime.addresses import is_loopback, url_host

READ_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_PATHS: Final = frozenset({"/api/health", "/api/authentication/configuration"})
"""Request paths (below any root path) served without a token."""
SITE_PATHS: Final = frozenset({"/api/site-calls/telemetry", "/api/site-notifications"})
"""Request paths (below any root path) where a site speaks: a site's token only (its
telemetry, its notifications)."""

_CHALLENGE = 'Bearer realm="controlroom"'


# --- dependencies -------------------------------------------------------------------------
async def authorize(request: Request) -> Caller | None:
    """The app-wide dependency: authenticate the caller and check what it may do, keeping
    an operator principal on ``request.state.principal`` and a site on
    ``request.state.site``.

    On ``SITE_PATHS``: the site whose token was presented (``None`` while no token of
    either kind is configured). Elsewhere: the operator principal, after checking the
    method's minimum role.

    Raises ``HTTPException`` 401 (missing or unknown token) or 403 (role too low, an
    operator's token where a site speaks, a site's token anywhere else).
    """
    if _app_path(request) in SITE_PATHS:
        site = _authenticate_site(request)
        request.state.site = site
        return site
    principal = _authenticate(request)
    needed: Role = "reader" if request.method in READ_METHODS else "operator"
    if not principal.may(needed):
        raise _forbidden(principal, needed)
    request.state.principal = principal
    return principal


async def require_admin(request: Request, _: Caller | None = Depends(authorize)) -> Principal:
    """Route dependency of admin-only routes. Raises ``HTTPException`` 403 otherwise."""
    principal = current_principal(request)
    if not principal.may("admin"):
        raise _forbidden(principal, "admin")
    return principal


def current_principal(request: Request) -> Principal:
    """Who made ``request`` (set by ``authorize``; ``ANONYMOUS`` on open routes)."""
    principal: Principal = getattr(request.state, "principal", ANONYMOUS)
    return principal


def current_site(request: Request) -> SitePrincipal | None:
    """The site that made ``request`` on a ``SITE_PATHS`` route (set by ``authorize``);
    ``None`` in the open dev mode, where a request may speak for any site."""
    site: SitePrincipal | None = getattr(request.state, "site", None)
    return site


def refuse_foreign_packets(request: Request, packets: Sequence[Any]) -> None:
    """Refuse a request in which a packet names a site other than the caller's.

    A packet names a site when it is a JSON object with a ``source_site``; one without
    is left to the contract (refused and kept as rejected telemetry). Called before
    anything of the request is read into the store, so a refused request is kept nowhere;
    the site's agent keeps its packets and sends them again once its configuration is
    fixed. Raises ``HTTPException`` 403 naming the packets' positions (at most ten).
    """
    site = current_site(request)
    if site is None:
        return
    foreign = [
        index
        for index, item in enumerate(packets)
        if isinstance(item, dict) and "source_site" in item and item["source_site"] != site.site
    ]
    if foreign:
        shown = ", ".join(str(index) for index in foreign[:10])
        raise HTTPException(
            403,
            f"source_site: packets at {shown}{', ...' if len(foreign) > 10 else ''} name "
            f"another site; this token speaks for site {site.site!r} only. Nothing of "
            "this request was kept",
        )


def _authenticate(request: Request) -> Principal:
    table: TokenTable = request.app.state.auth
    if table.open or _app_path(request) in OPEN_PATHS:
        return ANONYMOUS
    caller = _bearer(request, table)
    if isinstance(caller, SitePrincipal):
        raise HTTPException(403, f"the token of {caller.name} may only post that site's telemetry")
    return caller


def _authenticate_site(request: Request) -> SitePrincipal | None:
    table: TokenTable = request.app.state.auth
    if table.sites_open:
        return None
    caller = _bearer(request, table, wanted=_SITE_TOKEN)
    if isinstance(caller, Principal):
        raise HTTPException(
            403, f"token {caller.name!r} is an operator's; only {_SITE_TOKEN} may post for a site"
        )
    return caller


_SITE_TOKEN = "the site's own token (sites[].central_token, the agent's central_token)"


def _bearer(request: Request, table: TokenTable, *, wanted: str | None = None) -> Caller:
    """The caller the request's bearer token identifies. Raises ``HTTPException`` 401,
    saying which token is ``wanted`` when given."""
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    presented = presented.strip()
    which = f": {wanted}" if wanted else ""
    if scheme.lower() != "bearer" or not presented:
        raise HTTPException(
            401,
            f"a bearer token is required (header 'Authorization: Bearer <token>'){which}",
            headers={"WWW-Authenticate": _CHALLENGE},
        )
    caller = table.identify(presented)
    if caller is None:
        raise HTTPException(
            401,
            f"the bearer token is not valid{which}",
            headers={"WWW-Authenticate": f'{_CHALLENGE}, error="invalid_token"'},
        )
    return caller


def _app_path(request: Request) -> str:
    """The request's path below the root path an ASGI server or proxy mounted us at."""
    path: str = request.scope["path"]
    root: str = request.scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _forbidden(principal: Principal, needed: Role) -> HTTPException:
    return HTTPException(
        403,
        f"token {principal.name!r} has role {principal.role!r}; this needs role {needed!r}",
    )


# --- serve guard --------------------------------------------------------------------------
def ensure_serving_is_protected(settings: Settings) -> None:
    """Refuse to serve an open API beyond this machine.

    Raises ``ConfigurationError`` (saying why and what to do) when ``settings.host`` is
    not a loopback address and no ``auth_tokens`` are configured: anyone who can reach
    the port could then archive, retry and delete.
    """
    if settings.auth_tokens or is_loopback(settings.host):
        return
    raise ConfigurationError(
        f"refusing to serve on {url_host(settings.host)}:{settings.port} without "
        "authentication: "
        "anyone who can reach it could archive, retry and delete. Configure API tokens "
        "(auth_tokens in the TOML file, or CONTROLROOM_AUTH_TOKENS as JSON: "
        '[{"name": "...", "token": "...", "role": "reader|operator|admin"}]) '
        "or bind to a loopback address (--host 127.0.0.1)."
    )
