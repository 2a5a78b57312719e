"""Bearer-token authentication and role checks, applied to every route of the app.

Tokens come from the settings (``auth_tokens``: name, token, role), looked up in the
token table of ``controlroom.http.auth``. Roles, each with the rights of the ones before
it:

- ``reader``: ``GET``, ``HEAD`` (and ``OPTIONS``);
- ``operator``: any other method (archive, retry, resolve, comment, edit);
- ``admin``: routes that declare ``Depends(require_admin)`` (endpoint deletion).

Answers: 401 with ``WWW-Authenticate: Bearer`` when the token is missing, malformed or
unknown; 403 when the token's role may not do what was asked. Without any configured
token the API is open (every caller acts as ``admin``): the embedded default, which
``serve`` allows on a loopback address only (``ensure_serving_is_protected``).
``/api/health`` stays open so that monitoring needs no token, and
``/api/authentication/configuration`` so that a client can learn whether it needs one.

Tokens are compared in constant time (``TokenTable.find``), never logged or echoed; the
caller is named by its token's ``name``.
"""

from __future__ import annotations

from typing import Final

from fastapi import Depends, HTTPException, Request

from controlroom.config import Role, Settings
from controlroom.exceptions import ConfigurationError
from controlroom.http.auth import ANONYMOUS, Principal, TokenTable
from controlroom.runtime.addresses import is_loopback

READ_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_PATHS: Final = frozenset({"/api/health", "/api/authentication/configuration"})
"""Request paths (below any root path) served without a token."""

_CHALLENGE = 'Bearer realm="controlroom"'


# --- dependencies -------------------------------------------------------------------------
async def authorize(request: Request) -> Principal:
    """The app-wide dependency: authenticate the caller, check the method's minimum role,
    and keep the principal on ``request.state.principal``.

    Raises ``HTTPException`` 401 (missing or unknown token) or 403 (role too low).
    """
    principal = _authenticate(request)
    needed: Role = "reader" if request.method in READ_METHODS else "operator"
    if not principal.may(needed):
        raise _forbidden(principal, needed)
    request.state.principal = principal
    return principal


async def require_admin(principal: Principal = Depends(authorize)) -> Principal:
    """Route dependency of admin-only routes. Raises ``HTTPException`` 403 otherwise."""
    if not principal.may("admin"):
        raise _forbidden(principal, "admin")
    return principal


def current_principal(request: Request) -> Principal:
    """Who made ``request`` (set by ``authorize``; ``ANONYMOUS`` on open routes)."""
    principal: Principal = getattr(request.state, "principal", ANONYMOUS)
    return principal


def _authenticate(request: Request) -> Principal:
    table: TokenTable = request.app.state.auth
    if table.open or _app_path(request) in OPEN_PATHS:
        return ANONYMOUS
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        raise HTTPException(
            401,
            "a bearer token is required (header 'Authorization: Bearer <token>')",
            headers={"WWW-Authenticate": _CHALLENGE},
        )
    principal = table.find(presented)
    if principal is None:
        raise HTTPException(
            401,
            "the bearer token is not valid",
            headers={"WWW-Authenticate": f'{_CHALLENGE}, error="invalid_token"'},
        )
    return principal


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
        f"refusing to serve on {settings.host}:{settings.port} without authentication: "
        "anyone who can reach it could archive, retry and delete. Configure API tokens "
        "(auth_tokens in the TOML file, or CONTROLROOM_AUTH_TOKENS as JSON: "
        '[{"name": "...", "token": "...", "role": "reader|operator|admin"}]) '
        "or bind to a loopback address (--host 127.0.0.1)."
    )
