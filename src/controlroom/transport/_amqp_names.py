"""AMQP field names and short strings that are not UTF-8 must not cost the connection.

pamqp decodes header-table keys and short-string properties (``message_id``, ...) as
strict UTF-8; one producer that sends other bytes makes every frame of its message fail
to unmarshal, and aiormq drops the connection on each delivery, so the message is never
taken and every message behind it waits (docs/decisions.md "Headers that are not UTF-8
make a failed import"). ``install()`` makes those two
decoders fall back, only when strict UTF-8 fails, to UTF-8 with ``surrogateescape``: the
original bytes survive as lone surrogates (``"\\udcff"`` for byte 0xff), which the
ingestion pipeline recognises and keeps whole as a failed import. Values are untouched
(pamqp already hands invalid long strings over as bytes; ``rabbitmq.decode_headers``
decodes them the same way).
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import common, decode

_installed = False


def _short_str(value: bytes) -> tuple[int, str]:
    try:
        return _strict_short_str(value)
    except UnicodeDecodeError:
        length = value[0]
        return length + 1, value[1 : length + 1].decode("utf-8", "surrogateescape")


def _field_table(value: bytes) -> tuple[int, common.FieldTable]:
    try:
        return _strict_field_table(value)
    except UnicodeDecodeError:
        pass
    # A key is not UTF-8: read the table again, keys with surrogateescape; the values are
    # decoded by pamqp as usual.
    try:
        (length,) = struct.unpack_from(">I", value, 0)
        offset, end = 4, 4 + length
        table: dict[str, Any] = {}
        while offset < end:
            key_length = value[offset]
            key = value[offset + 1 : offset + 1 + key_length].decode("utf-8", "surrogateescape")
            offset += 1 + key_length
            consumed, table[key] = decode.embedded_value(value[offset:end])
            offset += consumed
    except (struct.error, IndexError, TypeError) as err:
        raise ValueError("Could not unpack data") from err
    return end, table


_strict_short_str = decode.short_str
_strict_field_table = decode.field_table


def install() -> None:
    """Put the tolerant decoders in pamqp's decoder tables (idempotent)."""
    global _installed
    if _installed:
        return
    decode.METHODS["shortstr"] = _short_str
    decode.METHODS["table"] = _field_table
    decode.TABLE_MAPPING[b"F"] = _field_table
    decode.short_str = _short_str
    decode.field_table = _field_table
    _installed = True
