"""The listening socket of every server the project runs (central's ``serve``, the site
agent's API, the site demo's agents and targets)."""

from __future__ import annotations

import errno
import socket

from controlroom.exceptions import ConfigurationError
from controlroom.runtime.addresses import bare_host


def listen(host: str, port: int, *, chosen_by: str | None = None) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free one; an IPv6 ``host`` bare
    or in brackets, ``[::1]``; ``::`` takes IPv4 connections too), bound before anything
    else starts so a taken port fails fast (and connections made as soon as the address is
    printed wait in the backlog). Its protocol is ``IPPROTO_TCP``, so every connection
    asyncio accepts on it gets ``TCP_NODELAY``. Raises ``ConfigurationError`` naming the
    address when it cannot be bound, and, when the address is taken, ``chosen_by`` (what
    chooses another port, e.g. ``"--port or CONTROLROOM_PORT"``)."""
    # An IPv6 address may be given as URLs write it ([::1]); the resolver takes it bare.
    address = bare_host(host)
    try:
        family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]
        # "::" is every address, IPv4's too, where the kernel allows one socket both.
        dualstack = address == "::" and socket.has_dualstack_ipv6()
        bound = socket.create_server((address, port), family=family, dualstack_ipv6=dualstack)
    except OSError as exc:
        hint = ""
        if chosen_by is not None and exc.errno == errno.EADDRINUSE:
            hint = f"; another port with {chosen_by}"
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc}{hint}") from exc
    # create_server leaves the protocol 0, and asyncio sets TCP_NODELAY on an accepted
    # connection only when its listener says IPPROTO_TCP: without it Nagle holds a small
    # body written after its headers until the client's delayed ACK (40 ms and more).
    return socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, fileno=bound.detach())
