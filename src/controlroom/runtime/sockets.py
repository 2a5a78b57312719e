"""The listening socket of a server (central's ``serve`` and the site agent's)."""

from __future__ import annotations

import socket

from controlroom.exceptions import ConfigurationError


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free one), bound before anything
    else starts so a taken port fails fast (and connections made as soon as the address is
    printed wait in the backlog). Raises ``ConfigurationError`` naming the address when it
    cannot be bound."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc}") from exc
