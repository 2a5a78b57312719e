"""``runtime.sockets.listen``: the any-address of IPv6 listens on IPv4 too (fresh-user
pass, fifth: ``CONTROLROOM_HOST=::`` answered on [::1] and refused 127.0.0.1, though the
kernel allows both on one socket)."""

from __future__ import annotations

import socket

import pytest

from controlroom.runtime.sockets import listen


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="this kernel has no dual stack")
@pytest.mark.parametrize("host", ["::", "[::]"])
def test_the_ipv6_any_address_takes_ipv4_connections_too(host: str) -> None:
    with listen(host, 0) as listener:
        port = listener.getsockname()[1]
        for address in ("127.0.0.1", "::1"):
            with socket.create_connection((address, port), timeout=5):
                accepted, _ = listener.accept()
                accepted.close()
