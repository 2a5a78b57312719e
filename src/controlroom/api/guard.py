"""Requests a browser could send without the user's consent are refused (docs/decisions.md
"Browsers cannot act through the API without consent").

Two ASGI middlewares, both pure functions of the request's headers:

- ``CrossSiteGuard`` (installed by ``create_app``): a state-changing request (``POST``,
  ``PUT``, ``PATCH``, ``DELETE``) that a browser marks as coming from another site is
  refused with 403 unless its ``Origin`` is one of ``cors_allowed_origins`` (ServicePulse
  served from another origin keeps working). A browser says so with ``Sec-Fetch-Site``
  (``same-site`` or ``cross-site``) or, when it sends no fetch metadata, with an
  ``Origin`` other than the request's own. Requests with neither header are not from a
  browser page (curl, ServiceControl clients, scripts) and pass: they cannot be forged by
  a page. Source: the Fetch Metadata and ``Origin`` checks the OWASP CSRF cheat sheet
  describes; no-cors ``fetch`` and form posts from any page carry both headers.
- ``HostGuard`` (installed by ``controlroom serve``, which knows the bound address): a
  request whose ``Host`` is not the bound address, ``localhost``/``127.0.0.1``/``[::1]``
  at the bound port, or one of ``allowed_hosts`` is refused with 421, so a page that
  rebinds its own name to this machine's address (DNS rebinding) cannot read the API.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from typing import Final

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

STATE_CHANGING: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES: Final = ("localhost", "127.0.0.1", "[::1]")


class CrossSiteGuard:
    """Refuse cross-site state-changing requests from browsers (module docstring)."""

    def __init__(self, app: ASGIApp, allowed_origins: Iterable[str]) -> None:
        self.app = app
        self.allowed = {origin.lower() for origin in allowed_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in STATE_CHANGING:
            reason = self.refusal(Headers(scope=scope), scope.get("scheme", "http"))
            if reason is not None:
                await _answer(send, 403, reason)
                return
        await self.app(scope, receive, send)

    def refusal(self, headers: Headers, scheme: str) -> str | None:
        """Why the request is refused, ``None`` when it may go on."""
        origin = headers.get("origin")
        site = headers.get("sec-fetch-site")
        if origin is not None and ("*" in self.allowed or origin.lower() in self.allowed):
            return None
        if site is not None:
            if site in ("same-origin", "none"):
                return None
            return (
                f"a {site} request from a browser may not change anything here; add its "
                "origin to cors_allowed_origins if it is a trusted console"
            )
        if origin is None:
            return None
        host = headers.get("host", "")
        if origin.lower() == f"{scheme}://{host}".lower():
            return None
        return (
            f"a request from origin {origin[:200]!r} may not change anything here; add it "
            "to cors_allowed_origins if it is a trusted console"
        )


class HostGuard:
    """Refuse a ``Host`` that is not this server's (module docstring)."""

    def __init__(
        self, app: ASGIApp, *, bound_host: str, port: int, allowed_hosts: Iterable[str] = ()
    ) -> None:
        self.app = app
        self.port = port
        self.bound = _normalize_host(bound_host)
        # An IP address as its one written form: [fd00:0::5] is [fd00::5].
        self.names = {_normalize_host(name).rstrip(".") for name in allowed_hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = Headers(scope=scope).get("host", "")
            if not self.allows(host):
                await _answer(
                    send,
                    421,
                    f"this server does not answer for host {host[:200]!r}; add the name to "
                    "allowed_hosts if it is this server's",
                )
                return
        await self.app(scope, receive, send)

    def allows(self, host_header: str) -> bool:
        """True for the bound address, a loopback name at the bound port, or a configured
        name (at any port: a proxy in front may listen elsewhere)."""
        name, port = _split_host(host_header)
        if not name:
            return False
        name = _normalize_host(name)
        if name in self.names:
            return True
        if port is not None and port != self.port:
            return False
        if name in LOOPBACK_NAMES or name == self.bound:
            return True
        # Bound to every address (0.0.0.0, ::): any IP literal of this machine; names
        # must be configured (a rebinding attack uses a name, never an address).
        return self.bound in ("0.0.0.0", "[::]") and _is_ip_literal(name)


def _split_host(header: str) -> tuple[str, int | None]:
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        if end < 0:
            return "", None
        name, rest = header[: end + 1], header[end + 1 :]
    else:
        name, _, port_text = header.partition(":")
        rest = f":{port_text}" if port_text else ""
    if rest:
        if not rest.startswith(":") or not rest[1:].isdigit():
            return "", None
        return name.rstrip("."), int(rest[1:])
    return name.rstrip("."), None


def _normalize_host(host: str) -> str:
    host = host.strip().lower()
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host
    return f"[{address.compressed}]" if address.version == 6 else address.compressed


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


async def _answer(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
