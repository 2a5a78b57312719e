"""Message bodies: where each one goes (pure) and the external body store (the only I/O).

Placement rule, docs/design.md "Body placement": ``max_body_size_to_store`` (the cap, bytes)
decides *where* a body is kept, never *whether*. A text body at or under the cap is inline
(``body_text``); a text body over it goes to the body store and keeps a searchable inline
prefix of at most the cap, cut on a UTF-8 character boundary; a binary body, one that is
not strictly UTF-8, or one containing NUL goes to the body store only. ``size`` is always
the true size in bytes.

Store layout (``FileSystemBodyStore``): ``<root>/<unique message id>/<sha256 hex of body>``.
Keys are content addressed, so a replayed batch rewrites the same file with the same bytes,
and are built and accepted only in the form ``<lower-case D GUID>/<64 lower-case hex>``:
no path is ever made from message text.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Protocol

from controlroom.errors.ingest.headers import parse_guid
from controlroom.errors.model import BodyPlacement
from controlroom.exceptions import BodyStoreError, ControlroomError

_KEY_RE = re.compile(
    r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})/([0-9a-f]{64})"
)
_TEXT_MARKERS = ("xml", "json")
_TEMP_PREFIX = ".tmp-"  # never a valid body file name (not 64 hex), so never served


# --- placement (pure) ---------------------------------------------------------------------
def is_text_body(content_type: str | None, content_encoding: str | None) -> bool:
    """True when a body of this type may be kept as text.

    Text when the content type (case-insensitive) starts with ``text/`` or contains ``xml``
    or ``json``, and there is no content encoding (a gzip'd JSON body is bytes, not text).
    A missing content type is not text (ServiceControl: a body of no named type is
    binary). Source: docs/design.md "Body placement".
    """
    if content_encoding or not content_type:
        return False
    kind = content_type.strip().lower()
    return kind.startswith("text/") or any(marker in kind for marker in _TEXT_MARKERS)


def place_body(
    body: bytes, content_type: str | None, content_encoding: str | None, cap: int
) -> BodyPlacement:
    """Decide where ``body`` is kept; ``cap`` is ``max_body_size_to_store`` in bytes (>= 0).

    * an empty body: nowhere (``external=False``, ``text=None``; ServiceControl stores no
      empty body and serves it as 204 No Content);
    * text, ``len(body) <= cap``: inline whole (``external=False``, ``text`` = the body);
    * text, ``len(body) > cap``: ``external=True`` and ``text`` = the longest prefix of at
      most ``cap`` bytes that ends on a UTF-8 character boundary;
    * not text (``is_text_body``), not strictly UTF-8, or containing NUL: ``external=True``,
      ``text=None``. The UTF-8 check covers the whole body, not only the prefix.

    ``size`` is always ``len(body)``. Raises ``ValueError`` for a negative cap.
    Source: docs/design.md "Body placement".
    """
    if cap < 0:
        raise ValueError(f"cap must be >= 0 bytes, got {cap}")
    data = bytes(body)
    size = len(data)
    if size == 0:
        return BodyPlacement(size=0, text=None, external=False)
    # NUL: a binary marker, and refused by PostgreSQL text.
    binary = not is_text_body(content_type, content_encoding) or b"\x00" in data
    if not binary and size <= cap:
        with contextlib.suppress(UnicodeDecodeError):
            return BodyPlacement(size=size, text=data.decode("utf-8", "strict"), external=False)
        binary = True
    if binary or not _is_strict_utf8(data):
        return BodyPlacement(size=size, text=None, external=True)
    # The whole body is valid UTF-8, so cutting before a lead byte leaves valid UTF-8.
    cut = utf8_boundary(data, cap)
    return BodyPlacement(size=size, text=_decode_prefix(data, cut), external=True)


VALIDATION_CHUNK = 1024 * 1024
"""Bytes of a body decoded at a time to check that it is UTF-8: a large body is never
decoded whole, so the check holds at most this much text besides the body."""


def _is_strict_utf8(data: bytes) -> bool:
    """True when ``data`` is strict UTF-8 (no surrogates, no overlongs). Decodes
    ``VALIDATION_CHUNK`` bytes at a time, through views of ``data`` (no copy of it)."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    view = memoryview(data)
    try:
        for start in range(0, len(data), VALIDATION_CHUNK):
            decoder.decode(view[start : start + VALIDATION_CHUNK])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    finally:
        view.release()
    return True


def _decode_prefix(data: bytes, cut: int) -> str:
    """The first ``cut`` bytes of ``data`` (valid UTF-8 ending on a boundary) as text,
    decoded through a view: no copy of the bytes first."""
    with memoryview(data)[:cut] as prefix:
        return codecs.decode(prefix, "utf-8")


def utf8_boundary(data: bytes, limit: int) -> int:
    """The largest index ``<= limit`` (and ``<= len(data)``) not inside a UTF-8 sequence.

    Steps back over continuation bytes (``10xxxxxx``); at most 3 steps for valid UTF-8.
    """
    cut = min(limit, len(data))
    while 0 < cut < len(data) and data[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut


# --- keys ---------------------------------------------------------------------------------
def body_key(unique_message_id: str, body: bytes) -> str:
    """The body-store key of ``body`` of message ``unique_message_id``.

    ``"<unique message id in lower-case D form>/<sha256 hex of body>"``: deterministic, so a
    replayed batch writes the same file. Raises ``ValueError`` when the id is not a GUID.
    """
    message_dir = _message_dir_name(unique_message_id)
    return f"{message_dir}/{hashlib.sha256(body).hexdigest()}"


def parse_body_key(key: str) -> tuple[str, str]:
    """Split a key into ``(unique message id, sha256 hex)``.

    Raises ``ValueError`` unless ``key`` is exactly ``<lower-case D GUID>/<64 lower-case
    hex>`` (so no key can name a path outside its message's directory).
    """
    match = _KEY_RE.fullmatch(key) if len(key) == 101 else None
    if match is None:
        raise ValueError(f"not a body key: {key[:120]!r}")
    return match.group(1), match.group(2)


def _message_dir_name(unique_message_id: str) -> str:
    guid = parse_guid(unique_message_id)
    if guid is None:
        raise ValueError(f"not a unique message id (GUID): {unique_message_id[:100]!r}")
    return guid


# --- the store ----------------------------------------------------------------------------
class BodyNotFoundError(ControlroomError, KeyError, FileNotFoundError):
    """No body is stored under the key. A ``KeyError`` and a ``FileNotFoundError`` both."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else "body not found"


class BodyStore(Protocol):
    """Storage of external bodies, addressed by ``body_key`` keys.

    ``put`` is durable when it returns (the row pointing at the body commits after it) and
    idempotent; ``get`` raises ``BodyNotFoundError`` when absent; ``delete_message`` removes
    every body of one message but the one ``keep`` names, and is a no-op when there is
    none. Store failures raise
    ``BodyStoreError``; malformed keys or ids raise ``ValueError``.
    """

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def exists(self, key: str) -> bool: ...

    def delete_message(self, unique_message_id: str, *, keep: str | None = None) -> None: ...


class FileSystemBodyStore:
    """A ``BodyStore`` on a local directory: ``<root>/<unique message id>/<sha256 hex>``.

    Writes are atomic and durable: a temporary file in the target directory is written,
    flushed and fsync'd, renamed over the target with ``os.replace``, and the directory is
    fsync'd (and the root too when the message directory is new), so after ``put`` returns
    the file survives a crash and a reader never sees a partial body. Safe for concurrent
    writers of the same key (the last rename wins; the bytes are identical).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``; its SHA-256 must be the key's hash.

        Raises ``ValueError`` for a malformed key or data that does not match it (a caller
        bug: the key would lie about the content), ``BodyStoreError`` when the write fails.
        A body already present with the right size is not rewritten: the key is its hash.
        """
        message_id, digest = parse_body_key(key)
        payload = bytes(data)
        if hashlib.sha256(payload).hexdigest() != digest:
            raise ValueError(f"data does not match body key {key}")
        target = self.root / message_id / digest
        try:
            if target.is_file() and target.stat().st_size == len(payload):
                return
            self._write_atomically(target, payload)
        except OSError as exc:
            raise BodyStoreError(f"cannot store body {key} under {self.root}: {exc}") from exc

    def get(self, key: str) -> bytes:
        """The body stored under ``key``.

        Raises ``ValueError`` for a malformed key, ``BodyNotFoundError`` when absent,
        ``BodyStoreError`` when it cannot be read.
        """
        message_id, digest = parse_body_key(key)
        try:
            return (self.root / message_id / digest).read_bytes()
        except FileNotFoundError as exc:
            raise BodyNotFoundError(f"no body stored under {key}") from exc
        except OSError as exc:
            raise BodyStoreError(f"cannot read body {key} under {self.root}: {exc}") from exc

    def exists(self, key: str) -> bool:
        """True when a body is stored under ``key``. Raises ``ValueError`` for a bad key."""
        message_id, digest = parse_body_key(key)
        return (self.root / message_id / digest).is_file()

    def delete_message(self, unique_message_id: str, *, keep: str | None = None) -> None:
        """Delete every body of ``unique_message_id`` but ``keep`` (a key of this message,
        or ``None``: delete them all); nothing to do when it has none.

        Raises ``ValueError`` when the id is not a GUID or ``keep`` is not one of its keys,
        ``BodyStoreError`` on failure.
        """
        message_dir = self.root / _message_dir_name(unique_message_id)
        kept = None
        if keep is not None:
            owner, kept = parse_body_key(keep)
            if owner != message_dir.name:
                raise ValueError(f"body key {keep} is not one of message {message_dir.name}")
        try:
            if kept is None:
                shutil.rmtree(message_dir)
            else:
                for entry in message_dir.iterdir():
                    if entry.name != kept:
                        entry.unlink(missing_ok=True)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise BodyStoreError(f"cannot delete bodies in {message_dir}: {exc}") from exc
        with contextlib.suppress(OSError):  # the deletion is done; durability is best effort
            _fsync_directory(message_dir if kept is not None else self.root)

    def _write_atomically(self, target: Path, payload: bytes) -> None:
        directory = target.parent
        created = not directory.is_dir()
        directory.mkdir(parents=True, exist_ok=True)
        fd, temp_name = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=directory)
        try:
            with os.fdopen(fd, "wb") as temp:
                temp.write(payload)
                temp.flush()
                os.fsync(temp.fileno())
            os.replace(temp_name, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp_name)
            raise
        _fsync_directory(directory)
        if created:
            _fsync_directory(self.root)


def _fsync_directory(directory: Path) -> None:
    """Make a rename or creation in ``directory`` durable (POSIX; a no-op elsewhere)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
