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

pamqp decodes nested tables and arrays by recursion: a header nested a few hundred deep
(2.5 KB) raised ``RecursionError`` in every delivery of its frame, with the same end.
``install()`` bounds the nesting: a table or array deeper than ``MAX_NESTING`` is not
decoded but kept as its AMQP bytes (``NestedTooDeep``), and the message
becomes a failed import kept whole (docs/decisions.md "Headers that are not UTF-8 make a
failed import").
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any

from pamqp import common, decode

MAX_NESTING = 32
"""Tables and arrays decoded one inside another, the message's header table the first:
NServiceBus's headers are flat, RabbitMQ's own (``x-death``) three deep."""

_installed = False
_nesting = threading.local()  # decoding runs on the connection's thread, one frame at a time

Decoder = Callable[[bytes], tuple[int, Any]]


class NestedTooDeep(bytes):
    """A table or an array nested past ``MAX_NESTING``, as its AMQP bytes (its length
    octets, then its fields); ``kind`` says which ("tables" or "arrays")."""

    kind: str

    def __new__(cls, data: bytes, kind: str) -> NestedTooDeep:
        value = super().__new__(cls, data)
        value.kind = kind
        return value


def nested_too_deep(headers: Mapping[str, Any] | None) -> str | None:
    """Why a message whose header table holds a ``NestedTooDeep`` value cannot be read
    whole (the first such header), else ``None``."""
    for name, value in (headers or {}).items():
        kind = _deep_kind(value)
        if kind is not None:
            return (
                f"header {str(name)!r} holds {kind} nested more than {MAX_NESTING} deep "
                "(the deeper levels kept as their AMQP bytes)"
            )
    return None


def _deep_kind(value: Any) -> str | None:
    # Recursion bounded by MAX_NESTING: the decoder nested no deeper.
    if isinstance(value, NestedTooDeep):
        return value.kind
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, list):
        return next((k for item in value if (k := _deep_kind(item)) is not None), None)
    return None


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


def _bounded(decoder: Decoder, kind: str) -> Decoder:
    """``decoder`` of a table or an array (4 octets of length, then its fields), which
    past ``MAX_NESTING`` levels answers the value's bytes (``NestedTooDeep``) instead of
    decoding it."""

    def decode_bounded(value: bytes) -> tuple[int, Any]:
        level = getattr(_nesting, "level", 0)
        if level >= MAX_NESTING:
            try:
                (length,) = struct.unpack_from(">I", value, 0)
            except struct.error as err:
                raise ValueError("Could not unpack data") from err
            if 4 + length > len(value):
                raise ValueError("Nested value length exceeds available data")
            return 4 + length, NestedTooDeep(value[: 4 + length], kind)
        _nesting.level = level + 1
        try:
            return decoder(value)
        finally:
            _nesting.level = level

    return decode_bounded


_strict_short_str = decode.short_str
_strict_field_table = decode.field_table
_bounded_field_table = _bounded(_field_table, "tables")
_bounded_field_array = _bounded(decode.field_array, "arrays")


def install() -> None:
    """Put the tolerant decoders in pamqp's decoder tables (idempotent)."""
    global _installed
    if _installed:
        return
    decode.METHODS["shortstr"] = _short_str
    decode.METHODS["table"] = _bounded_field_table
    decode.METHODS["array"] = _bounded_field_array
    decode.TABLE_MAPPING[b"F"] = _bounded_field_table
    decode.TABLE_MAPPING[b"A"] = _bounded_field_array
    decode.short_str = _short_str
    # pamqp's annotations promise a table or an array; past MAX_NESTING it is bytes.
    decode.field_table = _bounded_field_table  # type: ignore[assignment]
    decode.field_array = _bounded_field_array  # type: ignore[assignment]
    _installed = True
