"""The audit log's hash chain, without I/O: how an event is linked to the one before it.

Each month of ``occurred_at_utc`` is one chain (the purge removes whole months, so a chain
is either whole or gone). An event's place in its chain is ``chain_seq`` (1, 2, ... in
the order the events were written) and its ``chain_hash`` is the hex SHA-256 of the
previous event's hash followed by the event's canonical encoding; the first event of a
month follows ``GENESIS``. Changing, removing or reordering an event breaks the chain at
that event or the one after it (``controlroom audit verify``).

Source: docs/design.md "Audit log". Migration 0019 holds a frozen copy of ``link_hash``
for the events written before it (migrations never run live code): change both or
neither, and never change how a stored event is encoded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

GENESIS = "0" * 64
"""The "previous hash" of the first event of every month's chain."""

CHAINED_FIELDS = (
    "event_id",
    "occurred_at_utc",
    "occurred_at_tick",
    "ingested_at_utc",
    "actor",
    "action",
    "outcome",
    "category",
    "target",
    "source_site",
    "source_node",
    "correlation_id",
    "details_json",
    "payload_truncated",
    "chain_month",
    "chain_seq",
)
"""The columns an event's hash covers, in encoding order: every column but the hash."""


def chain_month(occurred_at: datetime) -> int:
    """The chain of an event that occurred at ``occurred_at`` (aware, or naive UTC): its
    UTC month as ``yyyymm``, e.g. ``202612``."""
    moment = occurred_at.astimezone(UTC) if occurred_at.tzinfo else occurred_at
    return moment.year * 100 + moment.month


def _canonical_value(value: Any) -> Any:
    if isinstance(value, datetime):
        naive = value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
        return naive.isoformat(timespec="microseconds")
    return value


def canonical(row: Mapping[str, Any]) -> bytes:
    """``row``'s ``CHAINED_FIELDS`` as compact JSON (a list, in that order; instants as
    naive UTC ISO text to the microsecond, as stored), UTF-8. Raises ``KeyError`` for a
    missing field."""
    values = [_canonical_value(row[name]) for name in CHAINED_FIELDS]
    return json.dumps(values, ensure_ascii=False, separators=(",", ":")).encode()


def link_hash(previous: str, row: Mapping[str, Any]) -> str:
    """The ``chain_hash`` of ``row`` following an event whose hash is ``previous``:
    hex SHA-256 of ``previous`` (ASCII) followed by ``canonical(row)``."""
    return hashlib.sha256(previous.encode() + canonical(row)).hexdigest()


Head = tuple[int, str]
"""A chain's newest event: its ``chain_seq`` and ``chain_hash``."""


def link_events(
    rows: Iterable[Mapping[str, Any]], heads: Mapping[int, Head]
) -> list[dict[str, Any]]:
    """``rows`` (new ``audit_log`` rows, in write order) with ``chain_month``,
    ``chain_seq`` and ``chain_hash`` set, each following its month's head in ``heads``
    (months absent there start a chain) or the row before it of the same month. The
    caller holds the months' chains locked from reading ``heads`` to its commit."""
    tips = dict(heads)
    linked = []
    for row in rows:
        month = chain_month(row["occurred_at_utc"])
        seq, previous = tips.get(month, (0, GENESIS))
        event = {**row, "chain_month": month, "chain_seq": seq + 1}
        event["chain_hash"] = link_hash(previous, event)
        tips[month] = (seq + 1, event["chain_hash"])
        linked.append(event)
    return linked


@dataclass(frozen=True, slots=True)
class Break:
    """Where a chain breaks: the event (``None`` for a chain gone whole), its chain and
    place as stored, and why."""

    event_id: str | None
    chain_month: int | None
    chain_seq: int | None
    reason: str


class ChainWalk:
    """Checks stored events fed in chain order (``chain_month``, then ``chain_seq``) with
    ``check``, then ``finish``; each returns the first break or ``None``.

    ``anchors``: the chains' heads an earlier intact walk recorded (``heads``): a chain
    must still pass through its anchor, which shows events removed from a month's end or
    a month's chain gone whole, which the links alone cannot. ``purgeable_before``: the
    first month (yyyymm) the purge never removes; an older month may be partly purged
    (the purge removes a month in chain order, a chunk per transaction), so its chain
    may start past place 1, and may be gone."""

    def __init__(
        self, anchors: Mapping[int, Head] | None = None, *, purgeable_before: int = 0
    ) -> None:
        self.events = 0
        self.heads: dict[int, Head] = {}
        """The newest event of each chain walked so far: month -> (place, hash)."""
        self._anchors = dict(anchors or {})
        self._purgeable_before = purgeable_before
        self._month: int | None = None
        self._last_event: str | None = None

    @property
    def chains(self) -> int:
        """Month chains walked so far."""
        return len(self.heads)

    def check(self, row: Mapping[Any, Any]) -> Break | None:
        """``None`` when ``row`` follows the previous row of its chain, else the break."""
        month, seq, stored = row["chain_month"], row["chain_seq"], row["chain_hash"]

        def broken(reason: str) -> Break:
            return Break(row["event_id"], month, seq, reason)

        if month != self._month and (ended := self._end_month()) is not None:
            return ended
        self.events += 1
        if month is None or seq is None or stored is None:
            return broken("the event is not chained (its chain columns are empty)")
        first = month != self._month
        self._month = month
        place, previous = self.heads.get(month, (0, GENESIS))
        if first and seq > 1 and month < self._purgeable_before:
            # The purge removed this month's first events; this one's link is unprovable.
            place, previous = seq - 1, ""
        if seq != place + 1:
            return broken(
                f"chain {month} goes from place {place} to {seq}: "
                + ("an event is missing" if seq > place + 1 else "an event appears twice")
            )
        if month != chain_month(row["occurred_at_utc"]):
            return broken(f"occurred_at_utc is not in the event's chain month {month}")
        if previous and link_hash(previous, row) != stored:
            return broken("the hash does not match: the event or the one before it was changed")
        anchor = self._anchors.get(month)
        if anchor is not None and anchor[0] == seq and anchor[1] != stored:
            return broken(
                "the chain differs from the one the last intact verification saw here: "
                "it was rewritten up to this place"
            )
        self.heads[month] = (seq, stored)
        self._last_event = row["event_id"]
        return None

    def finish(self) -> Break | None:
        """After the last row: whether the last chain reached its anchor, and every
        anchored chain not purgeable still exists."""
        ended = self._end_month()
        if ended is not None:
            return ended
        for month, (seq, _) in sorted(self._anchors.items()):
            if month not in self.heads and month >= self._purgeable_before:
                return Break(
                    None,
                    month,
                    None,
                    f"chain {month} is gone ({seq} events at the last intact verification), "
                    "though its month is not past retention",
                )
        return None

    def _end_month(self) -> Break | None:
        month = self._month
        if month is None or month not in self.heads:
            return None
        reached, anchor = self.heads[month][0], self._anchors.get(month)
        if anchor is not None and anchor[0] > reached:
            return Break(
                self._last_event,
                month,
                reached,
                f"chain {month} ends at place {reached}, but the last intact verification "
                f"saw it reach place {anchor[0]}: its newest events were removed",
            )
        return None
