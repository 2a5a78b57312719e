"""Text that came off the wire, made safe to show and to serialize; a site's id checked.

A transport hands over bytes that were not UTF-8 as lone surrogates (U+DC80..U+DCFF for
bytes 0x80..0xFF, ``surrogateescape``), and the store keeps them in ASCII-escaped JSON
(docs/decisions.md "Headers that are not UTF-8 make a failed import"). Such a ``str``
cannot be encoded as UTF-8: a page, a JSON answer or a terminal line holding one fails.
``escape_wire_text`` writes each as the escape of its byte (``\\xff``), as a body that is
not UTF-8 is shown; any other lone surrogate as ``\\udXXX``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_wire_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by the escape of what it stands for:
    ``"\\udcff"`` (byte 0xff) -> ``"\\\\xff"``, others ``"\\\\udXXX"``. Text without one is
    returned as it is. The result always encodes as UTF-8."""
    if text.isascii() or not _LONE_SURROGATE.search(text):
        return text
    return _LONE_SURROGATE.sub(_escape, text)


def escape_wire_headers(headers: Mapping[str, str | None]) -> dict[str, str | None]:
    """``headers`` with every name and value passed through ``escape_wire_text``. Two names
    that differ only in their invalid bytes stay distinct (their escapes differ)."""
    return {
        escape_wire_text(name): None if value is None else escape_wire_text(value)
        for name, value in headers.items()
    }


def storable_text(text: str) -> str:
    """``text`` as every store keeps it and every answer renders it, for text of ours that
    quotes a sender's decoded JSON (a refusal naming an unknown field): a NUL written as
    ``\\x00``, a lone surrogate as its code point's escape (``\\ud800``)."""
    escaped = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return escaped.replace("\x00", "\\x00")


def is_wire_text_clean(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (holds no lone surrogate)."""
    return text.isascii() or not _LONE_SURROGATE.search(text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def is_label(text: str) -> bool:
    """Whether ``text`` may name a thing to people and in stores: printable, neither blank
    nor starting or ending with space."""
    return text.isprintable() and bool(text.strip()) and text == text.strip()


def check_site_id(site_id: str) -> str:
    """``site_id`` itself when it may be a site's id; raises ``ValueError`` otherwise. A
    site's id is its ``source_site`` in telemetry, a label in logs and the console, and
    text in every store: printable (PostgreSQL refuses a NUL in text, a control character
    breaks the log's lines), and neither blank nor starting or ending with space
    (" north" is another site than "north", by mistake). One rule for central's
    ``sites``, the agent's ``site_id`` and the packets' ``source_site``."""
    if not is_label(site_id):
        raise ValueError(
            "a site's id is printable text, neither blank nor beginning or ending with space"
        )
    return site_id
