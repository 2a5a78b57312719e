"""The elements of a JSON array as they were sent: a site posts its packets and its
notifications as one array, and one the contract refuses is kept whole, byte for byte
(docs/decisions.md "Telemetry is refused, never truncated"): its key order, spacing,
repeated keys and numbers as written, which decoding and encoding again would change.
Pure: no I/O."""

from __future__ import annotations

import json
from typing import Any


def _not_json(literal: str) -> Any:
    raise ValueError(f"{literal} is not JSON (RFC 8259 section 6)")


_DECODER = json.JSONDecoder(parse_constant=_not_json)
_WHITESPACE = " \t\n\r"  # RFC 8259 section 2


def json_value(text: str) -> Any:
    """The value of ``text``, JSON as RFC 8259 defines it: Python's ``NaN`` and
    ``Infinity`` refused. Raises ``ValueError`` (``json.JSONDecodeError`` saying where),
    or ``RecursionError`` past what the decoder nests."""
    return _DECODER.decode(text)


def array_elements(body: bytes) -> list[tuple[Any, bytes]]:
    """Each element of ``body``, one JSON array in UTF-8 (RFC 8259 section 8.1; a leading
    byte order mark is ignored, as section 8.1 allows), in order: its decoded value and
    its exact bytes. Raises ``ValueError`` (``UnicodeDecodeError`` or
    ``json.JSONDecodeError``, saying where) when ``body`` is not that, Python's
    ``NaN`` and ``Infinity`` included, or holds an element nested deeper than the decoder
    recurses."""
    text = body.decode("utf-8-sig")
    position = _after_whitespace(text, 0)
    if not text.startswith("[", position):
        raise json.JSONDecodeError("expected a JSON array", text, position)
    position = _after_whitespace(text, position + 1)
    elements: list[tuple[Any, bytes]] = []
    if not text.startswith("]", position):
        while True:
            value, end = _decoded(text, position)
            elements.append((value, text[position:end].encode("utf-8")))
            position = _after_whitespace(text, end)
            if not text.startswith(",", position):
                break
            position = _after_whitespace(text, position + 1)
        if not text.startswith("]", position):
            raise json.JSONDecodeError("expected ',' or ']'", text, position)
    rest = _after_whitespace(text, position + 1)
    if rest != len(text):
        raise json.JSONDecodeError("extra data after the array", text, rest)
    return elements


def _decoded(text: str, position: int) -> tuple[Any, int]:
    """The JSON value starting at ``position`` and where it ends. Raises ``ValueError``
    for one nested deeper than Python's decoder can recurse (a ``RecursionError``
    otherwise, which no caller would take for bad input)."""
    try:
        return _DECODER.raw_decode(text, position)
    except RecursionError:
        raise ValueError(f"the element at character {position} is nested too deeply") from None


def _after_whitespace(text: str, position: int) -> int:
    while position < len(text) and text[position] in _WHITESPACE:
        position += 1
    return position
