"""Broker properties beyond headers and body, and their JSON form (pure: no I/O).

Source: docs/design.md "Python task queues". A Celery or Dramatiq worker reads more of
a message than string headers: its content encoding, correlation id, reply-to, priority
and a typed AMQP header table (ints, lists, nulls, nested tables). ``MessageProperties``
carries them through ``Transport.publish`` and back out on ``Delivery.properties``;
``properties_json`` / ``parse_properties`` keep them in one header of a failed message
(``Controlroom.TaskQueue.Properties``), so a retry sends the task message as its producer
did. ``header_strings`` is the string view of a typed table every consumer of a
transport sees in ``Delivery.headers``.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "priority",
    "message_id",
    "headers",
)
"""The broker properties ``properties_json`` keeps, AMQP's names."""


@dataclass(frozen=True, slots=True)
class MessageProperties:
    """Broker properties of a message besides its message id and content type (which
    ``publish`` takes on their own): ``content_encoding``, ``correlation_id``,
    ``reply_to``, ``priority`` (0-255) and ``headers``, a typed header table (values:
    ``None``, bool, int, float, str, bytes, timezone-aware datetime, lists and tables
    of these). ``None`` means absent."""

    content_encoding: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    priority: int | None = None
    headers: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.priority is not None and (
            isinstance(self.priority, bool)
            or not isinstance(self.priority, int)
            or not 0 <= self.priority <= 255
        ):
            raise ValueError(f"priority must be an int from 0 to 255, not {self.priority!r}")


def properties_json(properties: Mapping[str, Any]) -> str:
    """``properties`` (``PROPERTY_NAMES`` only, ``None`` values left out) as compact
    JSON. Header values keep their JSON types; bytes become ``{"$bytes": base64}`` and
    datetimes ``{"$datetime": ISO 8601}`` so ``parse_properties`` gives them back.

    Raises ``ValueError`` for a value JSON cannot hold (a set, an arbitrary object).
    """
    kept = {
        name: to_json_value(properties[name])
        for name in PROPERTY_NAMES
        if properties.get(name) is not None
    }
    return json.dumps(kept, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def parse_properties(text: str, *, header: str = "the properties") -> dict[str, Any]:
    """The broker properties ``properties_json`` wrote, with bytes and datetimes back.

    Raises ``ValueError`` (naming ``header``) when ``text`` is not a JSON object of
    known property names, with a table of headers and an integer priority, or holds a
    value AMQP cannot carry (nested too deep, an integer beyond 64 bits, a ``$bytes`` or
    ``$datetime`` that is not a string).
    """
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"{header} is nested too deep") from None
    if not isinstance(value, dict):
        raise ValueError(f"{header} is not a JSON object")
    unknown = sorted(set(value) - set(PROPERTY_NAMES))
    if unknown:
        raise ValueError(f"{header} names unknown properties: {', '.join(unknown)}")
    headers = value.get("headers")
    if headers is not None and not isinstance(headers, dict):
        raise ValueError(f"{header} headers is not a JSON object")
    for name in ("content_type", "content_encoding", "correlation_id", "reply_to", "message_id"):
        if value.get(name) is not None and not isinstance(value[name], str):
            raise ValueError(f"{header} {name} is not a string")
    priority = value.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ValueError(f"{header} priority is not an integer")
    try:
        return {name: from_json_value(item) for name, item in value.items()}
    except (TypeError, RecursionError) as exc:
        raise ValueError(f"{header} holds a value AMQP cannot carry: {exc}") from None


def message_properties(parsed: Mapping[str, Any]) -> MessageProperties:
    """The ``MessageProperties`` of what ``parse_properties`` returned (its content type
    and message id are the caller's). Raises ``ValueError`` for a priority out of range."""
    return MessageProperties(
        content_encoding=parsed.get("content_encoding"),
        correlation_id=parsed.get("correlation_id"),
        reply_to=parsed.get("reply_to"),
        priority=parsed.get("priority"),
        headers=parsed.get("headers"),
    )


def to_json_value(value: Any) -> Any:
    """``value`` as JSON can hold it (see ``properties_json``). Raises ``ValueError``."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, datetime.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, Mapping):
        return {str(key): to_json_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(item) for item in value]
    raise ValueError(f"a broker property value of type {type(value).__name__} has no JSON form")


def from_json_value(value: Any) -> Any:
    """The value ``to_json_value`` wrote. Raises ``ValueError`` for bad base64 or time."""
    if isinstance(value, dict):
        if set(value) == {"$bytes"}:
            return base64.b64decode(value["$bytes"], validate=True)
        if set(value) == {"$datetime"}:
            return datetime.datetime.fromisoformat(value["$datetime"])
        return {key: from_json_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_json_value(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        raise ValueError(f"the integer {value} does not fit an AMQP header (64 bits)")
    return value


def header_strings(raw: Mapping[str, Any] | None) -> dict[str, str | None]:
    """A typed header table -> ``{name: str | None}``, what consumers see.

    bytes (AMQP byte arrays, and long strings that are not UTF-8) decode as UTF-8,
    invalid bytes as lone surrogates (``surrogateescape``: byte 0xff is ``"\\udcff"``), so
    nothing is dropped and the pipeline keeps the message whole as a failed import
    (docs/decisions.md "Headers that are not UTF-8 make a failed import"); ``None`` (AMQP void)
    stays ``None``; booleans, numbers and timestamps become ``str(value)`` (timestamps
    as ISO 8601); nested tables and arrays become compact JSON of their decoded values.
    """
    return {str(name): _header_text(value) for name, value in (raw or {}).items()}


def structured_kinds(raw: Mapping[str, Any] | None) -> dict[str, str]:
    """``{name: "a table" | "an array"}`` for the headers of a typed table (or a stored JSON
    object) whose values are tables or arrays, whose text in ``header_strings`` is their
    JSON: a reader that expects text can tell such a value from text that looks like it."""
    kinds: dict[str, str] = {}
    for name, value in (raw or {}).items():
        if isinstance(value, Mapping):
            kinds[str(name)] = "a table"
        elif isinstance(value, list | tuple):
            kinds[str(name)] = "an array"
    return kinds


def _header_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="surrogateescape")
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, bool | int | float | decimal.Decimal):
        return str(value)
    return json.dumps(_jsonable(value), separators=(",", ":"), ensure_ascii=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool | int | float) or value is None:
        return value
    return _header_text(value)
