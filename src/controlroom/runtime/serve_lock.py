"""A running ``serve`` marks its data directory, so that ``make demo`` can refuse to
publish into the data of a demo that is already running (README "A first look").

``serve`` holds a *shared* lock on ``<data_dir>/serve.lock`` (``flock``) while it runs:
several ``serve`` processes may share a data directory. ``is_served`` asks for an
exclusive lock without waiting: refused while any ``serve`` holds its shared one. The
kernel drops the lock when the process ends, however it ends, so no stale file misleads.
Where ``flock`` does not exist (Windows) nothing is locked and ``is_served`` is False.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = "serve.lock"


@contextlib.contextmanager
def serving(data_dir: Path) -> Iterator[None]:
    """Hold the shared lock of ``data_dir`` (created when missing) for the block."""
    if fcntl is None:
        yield
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    with (data_dir / LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def is_served(data_dir: Path) -> bool:
    """Whether a ``serve`` runs on ``data_dir`` now (it holds the shared lock)."""
    path = data_dir / LOCK_FILE
    if fcntl is None or not path.exists():
        return False
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False
