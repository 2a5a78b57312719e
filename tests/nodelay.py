"""Whether a server sets ``TCP_NODELAY`` on the connections it accepts, read on the
server's side of a real connection (the option is local: a client cannot see it).

The servers under test run in this process, so the accepted socket is one of its file
descriptors: the one whose peer is the client's address. Without the option Nagle holds
a small body written after its headers until the client's delayed ACK (40 ms and more
on a keep-alive connection).
"""

from __future__ import annotations

import os
import socket

_INET = (socket.AF_INET, socket.AF_INET6)


def accepted_with_nodelay(host: str, port: int) -> bool:
    """Connect to ``host:port``, send ``GET /`` (HTTP/1.1, keep-alive) and wait for the
    answer's headers, so the server has accepted the connection and made its transport;
    then whether the server's socket of that connection has ``TCP_NODELAY``. Blocking:
    call it from a thread when the server runs on the caller's event loop. Raises
    ``AssertionError`` when no socket of this process is the connection's other end."""
    with socket.create_connection((host, port), timeout=30) as client:
        client.sendall(f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode("ascii"))
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = client.recv(65536)
            assert chunk, "the server closed the connection before answering"
            received += chunk
        return _nodelay_of_peer(client.getsockname()[:2])


def _nodelay_of_peer(client_address: tuple[str, int]) -> bool:
    for fd in os.listdir("/proc/self/fd"):
        try:
            candidate = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue  # not a socket (or closed since the listing)
        with candidate:
            if candidate.family not in _INET or candidate.type != socket.SOCK_STREAM:
                continue
            try:
                peer = candidate.getpeername()[:2]
            except OSError:
                continue  # a listener or an unconnected socket
            if peer == client_address:
                return bool(candidate.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    raise AssertionError(f"no socket of this process is connected to {client_address}")
