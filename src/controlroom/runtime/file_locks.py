"""Whether another process holds a lock file (``flock``), asked without waiting.

``serve`` marks its data directory (``runtime.serve_lock``) and the records of intake's
cgroups (``runtime.intake_cgroup``), and a site agent its tracking store (``site.store``),
by holding a lock on a file; the kernel drops it when the process
ends, however it ends. ``held_elsewhere`` asks for an exclusive lock without waiting and
gives it back at once: refused while any other process holds one. ``try_hold`` and
``release`` take and give back such a lock on an open file, as SQLite's writers' turn
does across processes (``db.providers.sqlite``). Where ``flock`` does not exist (Windows)
nothing is locked and the answer is False.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None  # type: ignore[assignment]


LOCKS = fcntl is not None
"""Whether this platform locks files at all: where it does not, no lock says a process
ended."""


def held_elsewhere(path: Path) -> bool:
    """Whether another process holds a lock (shared or exclusive) on the file at
    ``path``; False when the file does not exist (nothing is created)."""
    if fcntl is None:
        return False
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def hold(handle: IO[Any]) -> None:
    """Take an exclusive lock on the open file ``handle``, waiting for it; the kernel drops
    it when the file is closed or the process ends. Nothing where ``flock`` does not
    exist."""
    if fcntl is not None:
        fcntl.flock(handle, fcntl.LOCK_EX)


def try_hold(fd: int) -> bool:
    """Take an exclusive lock on the open file descriptor ``fd`` if no other open file
    holds one: True when taken (or where ``flock`` does not exist), False at once
    otherwise."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def release(fd: int) -> None:
    """Give back the lock ``try_hold`` took on ``fd``."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
