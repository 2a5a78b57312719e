"""Hosts as addresses: an IPv6 address with and without a URL's brackets, and whether a
bound host is this machine only."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True when ``host`` is a loopback address (``127.0.0.0/8``, ``::1``) or
    ``localhost``. Other names are not resolved: a name is trusted as loopback only when
    it is ``localhost`` itself."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare_host(host)).is_loopback
    except ValueError:
        return False


def bare_host(host: str) -> str:
    """``host`` without the brackets a URL puts around an IPv6 address (``[::1]`` ->
    ``::1``), as resolvers and sockets take it; any other host as it is."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def url_host(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets (``::1`` -> ``[::1]``);
    any other host, or one already in brackets, as it is."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
