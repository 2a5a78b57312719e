"""Stamps to 100 ns: the instants a site reports, kept exactly as sent.

Source: docs/design.md "Stamps". Sites that stamp like .NET ``datetime2`` send seven
fractional digits (``2026-01-01T08:30:00.1234569Z``); Python's ``datetime`` and
PostgreSQL's ``timestamp`` hold six. A ``Stamp`` is the instant to the microsecond (a
zone-aware UTC ``datetime``) and the 100 ns tick past it (0-9), ordered by both, so two
packets 100 ns apart are two stamps, and a cursor over rows sharing a microsecond moves.
Stores keep it in two columns, ``<name>_utc`` (the instant: every index, filter and KPI
reads it as before) and ``<name>_tick`` (``stamp_values``, ``stamp_of``).

Text: read from ISO 8601 with a zone and at most seven fractional digits (more are
refused, never cut); written in the .NET round-trip format, UTC with seven digits always
(``2026-01-01T08:30:00.1234560Z``). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

TICKS_PER_MICROSECOND = 10
_EPOCH = datetime(1, 1, 1, tzinfo=UTC)
# The date (no 'T' or space in it), the time to the second, then its fraction: the first
# '.' or ',' after the seconds is theirs (a zone's own seconds come later).
_FRACTION = re.compile(r"[^T ]*[T ]\d{2}:?\d{2}:?\d{2}[.,](\d+)")


def as_utc(value: datetime) -> datetime:
    """``value`` (zone-aware) in UTC. Raises ``ValueError`` when that leaves years 1-9999
    (a zone can carry such a time, no store holds it): the value's fault, so a validator
    using this names its field."""
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("must be a time within years 1 to 9999 once converted to UTC") from None


class Stamp:
    """A UTC instant to 100 ns: ``instant`` (zone-aware UTC, to the microsecond) and
    ``tick``, the hundreds of nanoseconds past it (0-9). Immutable, hashable, ordered by
    both.

    Raises ``ValueError`` for a naive ``instant`` or a ``tick`` outside 0-9.
    """

    # A plain class, not a dataclass: FastAPI takes a dataclass for a body, never for a
    # query parameter, and the site agent's pull takes ``since`` as one.
    __slots__ = ("instant", "tick")
    instant: datetime
    tick: int

    def __init__(self, instant: datetime, tick: int = 0) -> None:
        if instant.tzinfo is None:
            raise ValueError("a stamp's instant must be zone-aware")
        if not 0 <= tick < TICKS_PER_MICROSECOND:
            raise ValueError(f"a stamp's tick is 0-9 (100 ns), not {tick}")
        object.__setattr__(self, "instant", as_utc(instant))
        object.__setattr__(self, "tick", tick)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Stamp is immutable")

    def _key(self) -> tuple[datetime, int]:
        return (self.instant, self.tick)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stamp) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Stamp):
            return NotImplemented
        return self._key() < other._key()

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Stamp):
            return NotImplemented
        return self._key() <= other._key()

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Stamp):
            return NotImplemented
        return self._key() > other._key()

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Stamp):
            return NotImplemented
        return self._key() >= other._key()

    def __repr__(self) -> str:
        return f"Stamp({self.isoformat()!r})"

    @classmethod
    def of(cls, value: datetime) -> Stamp:
        """``value`` (zone-aware) as a stamp with no 100 ns part."""
        return cls(value)

    @classmethod
    def parse(cls, text: str) -> Stamp:
        """The stamp ``text`` says: ISO 8601 with a zone, at most seven fractional digits.

        Raises ``ValueError`` saying what is wrong (no zone, more than seven digits, a
        time outside years 1-9999 once in UTC, not ISO 8601).
        """
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError("must be ISO 8601 text with a zone, in years 1-9999") from None
        if parsed.tzinfo is None:
            raise ValueError("must be ISO 8601 text with a zone")
        fraction = _FRACTION.match(text)
        digits = fraction.group(1) if fraction else ""
        if len(digits) > 7:
            raise ValueError(f"must have at most 7 fractional digits (100 ns), not {len(digits)}")
        # fromisoformat keeps six digits and drops the rest: the seventh is the tick.
        return cls(as_utc(parsed), int(digits[6]) if len(digits) == 7 else 0)

    def isoformat(self) -> str:
        """The .NET round-trip text: UTC, seven fractional digits, ``Z``."""
        naive = self.instant.replace(tzinfo=None).isoformat(timespec="microseconds")
        return f"{naive}{self.tick}Z"

    def __str__(self) -> str:
        return self.isoformat()

    @property
    def ticks(self) -> int:
        """100 ns since 0001-01-01T00:00Z (.NET's ``DateTime.Ticks`` of the UTC time)."""
        return (self.instant - _EPOCH) // timedelta(microseconds=1) * 10 + self.tick

    @classmethod
    def from_ticks(cls, ticks: int) -> Stamp:
        """The stamp ``ticks`` (``Stamp.ticks``) says. Raises ``OverflowError`` outside
        years 1-9999."""
        micro, tick = divmod(ticks, TICKS_PER_MICROSECOND)
        return cls(_EPOCH + timedelta(microseconds=micro), tick)

    def next(self) -> Stamp:
        """The stamp 100 ns later. Raises ``OverflowError`` past year 9999."""
        return Stamp.from_ticks(self.ticks + 1)

    # --- pydantic: validated from text (or a Stamp, or an aware datetime), dumped as text
    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            _validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                Stamp.isoformat, when_used="json"
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {
            "type": "string",
            "format": "date-time",
            "description": "ISO 8601 with a zone, at most 7 fractional digits (100 ns)",
        }


def _validate(value: Any) -> Stamp:
    # Lax parsing would take a number as Unix seconds; the contract says ISO 8601 text.
    if isinstance(value, Stamp):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("must be ISO 8601 text with a zone")
        return Stamp.of(value)
    if not isinstance(value, str):
        raise ValueError("must be ISO 8601 text with a zone")
    return Stamp.parse(value)


def round_trip(value: datetime) -> str:
    """``value`` (zone-aware) as ``Stamp.isoformat`` writes it: UTC, seven fractional
    digits, ``Z`` (the one format the site-call API answers times in)."""
    return Stamp.of(value).isoformat()


def stamp_values(name: str, stamp: Stamp | None) -> dict[str, Any]:
    """The two columns ``stamp`` is stored in: ``{name}_utc`` (the instant, ``None`` for
    no stamp) and ``{name}_tick`` (0 for no stamp)."""
    if stamp is None:
        return {f"{name}_utc": None, f"{name}_tick": 0}
    return {f"{name}_utc": stamp.instant, f"{name}_tick": stamp.tick}


def stamp_of(row: Any, name: str) -> Stamp | None:
    """The stamp stored in ``row``'s ``{name}_utc`` and ``{name}_tick`` (attributes, or
    keys of a mapping); ``None`` when the instant is null."""
    if isinstance(row, Mapping):
        instant, tick = row[f"{name}_utc"], row[f"{name}_tick"]
    else:
        instant, tick = getattr(row, f"{name}_utc"), getattr(row, f"{name}_tick")
    return None if instant is None else Stamp(instant, tick)
