"""How the console shows a failed message's body: pretty JSON or XML, text as is, or a
hex view for binary; a compressed body (``Content-Encoding`` gzip or deflate) decompressed
first. Pure functions: the caller reads the bytes (inline text or the body store).

A Python task's body of its task queue's JSON shape also gives the task's arguments
(``errors/tasks.py``), shown above the body.

The result is plain text for the template, which escapes it: nothing of a body is ever
markup. Shown text is capped at ``MAX_SHOWN_BYTES`` and the hex view at
``MAX_HEX_BYTES``; a view that shows less than the whole body says so (the download has
it all).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Literal
from xml.dom import minidom
from xml.parsers.expat import ExpatError

from controlroom.errors.tasks import TaskArguments, task_arguments

MAX_SHOWN_BYTES = 1024 * 1024
MAX_HEX_BYTES = 4096
MAX_DECOMPRESSED_BYTES = 16 * 1024 * 1024
"""A compressed body is shown only while it inflates to at most this (a zip bomb is not)."""

BodyKind = Literal["json", "xml", "text", "binary"]


@dataclass(frozen=True, slots=True)
class BodyView:
    """What the message page shows of a body."""

    kind: BodyKind
    text: str  # pretty text, or the hex dump for binary
    size: int  # bytes of the body as stored
    shown_size: int  # bytes the view covers (after decompression)
    decoded_size: int  # bytes after decompression (== size when not compressed)
    encoding: str | None  # the Content-Encoding that was undone, if any
    note: str | None  # why the view is partial or raw, for the operator
    arguments: TaskArguments | None = None  # a Python task's, from a whole JSON body

    @property
    def partial(self) -> bool:
        return self.shown_size < self.decoded_size


def view_body(
    data: bytes, content_type: str, content_encoding: str | None, task_queue: str | None = None
) -> BodyView:
    """The view of ``data`` (the exact stored body) with its ``content_type`` and the
    ``Content-Encoding`` header of the message, if any. ``task_queue`` (``celery`` or
    ``dramatiq``, the ``Controlroom.TaskQueue`` header) reads a whole JSON body of that task
    queue's shape as the task's ``arguments`` too."""
    encoding = (content_encoding or "").strip().lower() or None
    note = None
    decoded = data
    if encoding is not None:
        try:
            decoded = _decompress(data, encoding)
        except (ValueError, zlib.error) as exc:
            encoding, note = None, f"shown as stored: {exc}"
    kind = _kind(decoded, content_type)
    if kind == "binary":
        shown = decoded[:MAX_HEX_BYTES]
        return BodyView(
            "binary", hex_dump(shown), len(data), len(shown), len(decoded), encoding, note
        )
    shown = decoded[:MAX_SHOWN_BYTES]
    text = shown.decode("utf-8", errors="replace")
    pretty = _pretty(text, kind) if len(shown) == len(decoded) else None
    if pretty is None and kind in ("json", "xml"):
        kind = "text"
    arguments = task_arguments(task_queue, text) if kind == "json" else None
    return BodyView(
        kind, pretty or text, len(data), len(shown), len(decoded), encoding, note, arguments
    )


def hex_dump(data: bytes) -> str:
    """16 bytes a line: offset, hex bytes, and the printable ASCII ones (others as ``.``)."""
    lines = []
    for offset in range(0, len(data), 16):
        chunk = data[offset : offset + 16]
        hexes = " ".join(f"{byte:02x}" for byte in chunk)
        ascii_ = "".join(chr(byte) if 0x20 <= byte < 0x7F else "." for byte in chunk)
        lines.append(f"{offset:08x}  {hexes:<47}  {ascii_}")
    return "\n".join(lines)


def _decompress(data: bytes, encoding: str) -> bytes:
    if encoding in ("gzip", "x-gzip"):
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        inflater = zlib.decompressobj()
    else:
        raise ValueError(f"Content-Encoding {encoding[:40]!r} is not one the console can undo")
    decoded = inflater.decompress(data, MAX_DECOMPRESSED_BYTES + 1)
    if len(decoded) > MAX_DECOMPRESSED_BYTES:
        raise ValueError(f"it inflates to more than {MAX_DECOMPRESSED_BYTES} bytes")
    return decoded


def _kind(data: bytes, content_type: str) -> BodyKind:
    lowered = content_type.lower()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "binary"
    if "\x00" in text:
        return "binary"
    if "json" in lowered:
        return "json"
    if "xml" in lowered:
        return "xml"
    if lowered.startswith("text/"):
        return "text"
    # No telling content type (ServiceControl treats that as binary): show the bytes as
    # text only when they are printable UTF-8 text.
    printable = all(ch.isprintable() or ch in "\r\n\t" for ch in text[:MAX_HEX_BYTES])
    return "text" if printable and text else "binary"


def _pretty(text: str, kind: BodyKind) -> str | None:
    """Indented JSON or XML; ``None`` when ``text`` does not parse, or nests deeper than
    the parser goes (shown as is)."""
    if kind == "json":
        try:
            return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except (ValueError, RecursionError):  # nested deeper than the parser goes
            return None
    if kind == "xml":
        try:
            # expat does not fetch external entities, and refuses entity expansion bombs
            # (expat >= 2.4); the text is already capped at MAX_SHOWN_BYTES.
            pretty = minidom.parseString(text.encode("utf-8")).toprettyxml(indent="  ")
        except (ExpatError, ValueError, RecursionError):
            return None
        return "\n".join(line for line in pretty.splitlines() if line.strip())
    return None
