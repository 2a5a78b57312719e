"""``controlroom demo run`` (what ``make demo`` runs): check every port the demo takes,
then run ``serve`` and the demo's helper processes side by side, and stop them all when
any of them ends (README "Quick start"; docs/decisions.md "make demo is all or nothing").

The demo takes central's port and 11-15 past it (``demo_ports``: the site agents and their
targets; ``sink_ports``: the notification sinks). All of them are checked before
anything is published, so a taken one is refused in one line naming it, not found out
when a helper dies half-way. So are the site agents' tracking stores, which live under
the demo's data directory as everything it writes does (``demo_store_path``): one held
by another process is refused the same way. A helper that exits while the demo runs
stops the demo: a console without its site agents or endpoints would show a demo that no
longer works.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from controlroom.demo_notifications import sink_ports
from controlroom.runtime.addresses import bare_host, url_host
from controlroom.runtime.sockets import listen
from controlroom.site.demo import SITE_NAMES, demo_ports, demo_store_path
from controlroom.site.store import in_use

PORT_CHOSEN_BY = "CONTROLROOM_PORT"
"""What chooses the demo's ports: central's, and the helpers' follow it."""

_POLL_SECONDS = 0.2  # how often the supervisor looks for a child that exited


@dataclass(frozen=True, slots=True)
class Helper:
    """One process of the demo: ``name`` as printed, ``argv`` to start it, ``env`` extra
    environment variables (added to this process's); ``listens_on`` a (host, port) the
    next helpers wait for (central, so the site agents find it up, not unreachable);
    ``stop_seconds`` how long it has after SIGTERM before it is killed."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    listens_on: tuple[str, int] | None = None
    stop_seconds: float = 10.0


def central_address(host: str, port: int) -> tuple[str, int]:
    """Where the demo's helpers connect to a serve listening on ``host`` and ``port``:
    ``host`` without an IPv6 address's brackets, loopback for an any-address (``0.0.0.0``
    and empty: 127.0.0.1, ``::``: ::1)."""
    bare = bare_host(host)
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(bare, bare), port


def central_url(host: str, port: int) -> str:
    """The URL of ``central_address`` (``http://[::1]:8080`` for an IPv6 address)."""
    address, port = central_address(host, port)
    return f"http://{url_host(address)}:{port}"


def demo_listeners(host: str, central_port: int) -> list[tuple[str, int, str]]:
    """Every (host, port, what) the demo listens on, central first: the site agents and
    their targets on loopback, the notification sinks on loopback."""
    north, south, targets = demo_ports(central_port)
    hook, smtp = sink_ports(central_port)
    loopback = "127.0.0.1"
    return [
        (host, central_port, "the console (controlroom serve)"),
        (loopback, north, "site agent north"),
        (loopback, south, "site agent south"),
        (loopback, targets, "the site agents' targets"),
        (loopback, hook, "the webhook sink"),
        (loopback, smtp, "the SMTP sink"),
    ]


def first_taken_port(listeners: Sequence[tuple[str, int, str]]) -> tuple[str, int, str] | None:
    """The first (host, port, what) of ``listeners`` already taken by another process, or
    None when every one can be bound (each is bound and closed again at once). Other
    errors than a taken address (an unknown host, a privileged port) raise
    ``ConfigurationError`` as ``listen`` does."""
    from controlroom.exceptions import ConfigurationError

    for host, port, what in listeners:
        try:
            listen(host, port).close()
        except ConfigurationError as exc:
            cause = exc.__cause__
            if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
                return host, port, what
            raise
    return None


def first_store_in_use(data_dir: Path) -> Path | None:
    """The first of the demo's site agents' tracking stores under ``data_dir`` that
    another process has open (a site demo of that data directory), or None."""
    for site in SITE_NAMES:
        path = demo_store_path(data_dir, site)
        if in_use(path):
            return path
    return None


def controlroom_argv(*args: str) -> list[str]:
    """``controlroom *args`` run by this interpreter (``python -m controlroom``)."""
    return [sys.executable, "-m", "controlroom", *args]


def supervise(helpers: Sequence[Helper], say: Callable[[str], None]) -> int:
    """Start every helper, then wait until one exits or this process gets SIGINT, SIGTERM
    or SIGHUP, and stop the others (SIGTERM, then SIGKILL after each one's
    ``stop_seconds``). Each helper runs in a process group of its own, so that Ctrl+C in
    the terminal (SIGINT to the whole foreground group) reaches only this process and
    each helper gets one signal: a second would end serve at once. Returns 0 when
    stopped by a signal (``say`` tells that the stop begins and that it ended), 1 when a
    helper exited on its own (``say`` names it and its exit status, then that the stop
    ended)."""
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)

    # SIGHUP too: a closed terminal must not leave the demo's processes running alone.
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, on_signal) for sig in signals}
    started: list[tuple[Helper, subprocess.Popen[bytes]]] = []
    try:
        for helper in helpers:
            env = {**os.environ, **helper.env} if helper.env else None
            process = subprocess.Popen(list(helper.argv), env=env, process_group=0)
            started.append((helper, process))
            while helper.listens_on is not None and not stopping:
                if _exited(started, say):
                    return 1
                if _accepts(helper.listens_on):
                    break
                time.sleep(_POLL_SECONDS)
        while not stopping:
            if _exited(started, say):
                return 1
            time.sleep(_POLL_SECONDS)
        say(f"demo: {signal.Signals(stopping[0]).name} received; stopping the demo.")
        return 0
    finally:
        _stop_all(started)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if started:  # stopped by a signal or by a helper that exited: said either way
            say("demo: stopped.")


def _exited(
    started: Sequence[tuple[Helper, subprocess.Popen[bytes]]], say: Callable[[str], None]
) -> bool:
    """Whether one of ``started`` has exited (``say`` names the first)."""
    for helper, process in started:
        code = process.poll()
        if code is not None:
            say(f"demo: {helper.name} exited ({_describe_status(code)}); stopping the demo.")
            return True
    return False


def _accepts(address: tuple[str, int]) -> bool:
    try:
        socket.create_connection(address, timeout=1).close()
    except OSError:
        return False
    return True


def _describe_status(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _stop_all(started: Sequence[tuple[Helper, subprocess.Popen[bytes]]]) -> None:
    for _, process in started:
        if process.poll() is None:
            process.terminate()
    stopped_at = time.monotonic()
    for helper, process in started:
        try:
            process.wait(max(0.0, stopped_at + helper.stop_seconds - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
