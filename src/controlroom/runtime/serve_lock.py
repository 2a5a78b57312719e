"""A running ``serve`` marks its data directory, so that ``make demo`` can refuse to
publish into the data of a demo that is already running (README "A first look").

``serve`` holds a *shared* lock on ``<data_dir>/serve.lock`` (``flock``) while it runs:
several ``serve`` processes may share a data directory. ``is_served`` asks for an
exclusive lock without waiting: refused while any ``serve`` holds its shared one. The
kernel drops the lock when the process ends, however it ends, so no stale file misleads.
Where ``flock`` does not exist (Windows) nothing is locked and ``is_served`` is False.

Serves that share a store must consume one broker (docs/design.md "Process
shape"): a second serve of the same store on another broker would claim retries and
send them where the first one's endpoints never look. So each serve also holds a shared
lock on ``serve-<digest of its store identity>.lock``, whose content the first of them writes: its
broker. A serve of that store on another broker is refused while any of them runs. Only
serves that share a data directory see each other's marks.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from controlroom.exceptions import ConfigurationError
from controlroom.runtime.file_locks import held_elsewhere

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = "serve.lock"


@contextlib.contextmanager
def serving(data_dir: Path, *, store: str, broker: str, shown: str | None = None) -> Iterator[None]:
    """Hold the shared locks of ``data_dir`` (created when missing) for the block: the
    directory's, and that of ``store`` (the database's identity, one text however its
    URL is spelt: ``Provider.store_identity``) recording ``broker`` (the transport's
    ``destination``). Raises ``ConfigurationError``, naming the store as ``shown`` (its
    URL, password hidden; default ``store``) and both brokers, when a serve of the same
    store runs with another broker."""
    if fcntl is None:
        yield
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    with (
        (data_dir / LOCK_FILE).open("a") as directory,
        _store_lock(data_dir, store).open("a+", encoding="utf-8") as of_store,
    ):
        _hold_store(of_store, store=shown or store, broker=broker, data_dir=data_dir)
        fcntl.flock(directory, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(directory, fcntl.LOCK_UN)
            fcntl.flock(of_store, fcntl.LOCK_UN)


def _hold_store(handle: IO[str], *, store: str, broker: str, data_dir: Path) -> None:
    """Take the store's shared lock: as the first serve of the store, after recording
    ``broker``; as a later one, after checking that the recorded broker is ``broker``."""
    assert fcntl is not None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # other serves of this store run: they recorded their broker
        fcntl.flock(handle, fcntl.LOCK_SH)
        handle.seek(0)
        recorded = handle.read()
        if recorded and recorded != broker:
            fcntl.flock(handle, fcntl.LOCK_UN)
            raise ConfigurationError(
                f"another controlroom serve runs on {store} (data directory {data_dir}) "
                f"consuming {recorded}; this one would consume {broker}, and each would "
                "take retries meant for the other's endpoints. Give this serve its own "
                "CONTROLROOM_DATA_DIR (and database), or the same CONTROLROOM_BROKER_URL."
            ) from None
        return
    handle.seek(0)
    handle.truncate()
    handle.write(broker)
    handle.flush()
    fcntl.flock(handle, fcntl.LOCK_SH)  # others may read it now


def _store_lock(data_dir: Path, store: str) -> Path:
    digest = hashlib.sha256(store.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return data_dir / f"serve-{digest}.lock"


def serving_broker(data_dir: Path, *, store: str) -> str | None:
    """The broker the serves of ``store`` running on ``data_dir`` consume (what the first
    of them recorded), or ``None`` when none runs: a command that publishes for them (a
    re-import) checks it is the broker it would publish to."""
    path = _store_lock(data_dir, store)
    if not path.exists() or not held_elsewhere(path):
        return None
    return path.read_text(encoding="utf-8") or None


def has_served(data_dir: Path, *, store: str) -> bool:
    """Whether a serve of ``store`` has ever run on ``data_dir`` (its store's lock file is
    there, held or not): an embedded queue of a data directory none ever ran on is read by
    no serve of that store."""
    return _store_lock(data_dir, store).exists()


def is_served(data_dir: Path) -> bool:
    """Whether a ``serve`` runs on ``data_dir`` now (it holds the shared lock)."""
    return held_elsewhere(data_dir / LOCK_FILE)
