"""What a listening address means: whether a bound host is this machine only."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True when ``host`` is a loopback address (``127.0.0.0/8``, ``::1``) or
    ``localhost``. Other names are not resolved: a name is trusted as loopback only when
    it is ``localhost`` itself."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
