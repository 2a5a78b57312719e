"""The site-call ordering rules as pure functions: status ranks and the ordering key.

Source: docs/design.md "Monotonic upsert" and "Epoch". Ranks:
Submitted 0 < Forwarded 1 < Attempted = Skipped 2 < Parked 3 (non-terminal, awaits an
operator) < Delivered = Failed = Discarded 4 (terminal). The ordering key is
``(epoch, rank, updated_at_utc)``. A newer state supersedes the stored one when

- its epoch is higher (the site bumps it when an operator retries a Parked call), or
- in the same epoch its rank is higher, or
- in the same epoch and the same non-terminal rank, its ``updated_at_utc`` is newer, to
  the 100 ns (``telemetry.stamps``), so ``retry_count``, ``last_error``, ``http_status``
  stay live.

An equal terminal rank is immutable (Delivered after Failed changes nothing); equal
stamps and lower keys are no-ops. ``controlroom.sitecalls.upsert`` states the same rule
in SQL; ``supersedes`` is its Python twin, used to fold a batch before writing it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Protocol, TypeVar

from controlroom.telemetry.stamps import Stamp


class SiteCallStatus(enum.StrEnum):
    """Lifecycle status of a cached call, as the site reports it."""

    SUBMITTED = "Submitted"
    FORWARDED = "Forwarded"
    ATTEMPTED = "Attempted"
    SKIPPED = "Skipped"
    PARKED = "Parked"
    DELIVERED = "Delivered"
    FAILED = "Failed"
    DISCARDED = "Discarded"


class Channel(enum.StrEnum):
    """What kind of cached call: an outbound API call or a database write."""

    API_OUTBOUND = "ApiOutbound"
    DB_OUTBOUND = "DbOutbound"


RANKS: dict[SiteCallStatus, int] = {
    SiteCallStatus.SUBMITTED: 0,
    SiteCallStatus.FORWARDED: 1,
    SiteCallStatus.ATTEMPTED: 2,
    SiteCallStatus.SKIPPED: 2,
    SiteCallStatus.PARKED: 3,
    SiteCallStatus.DELIVERED: 4,
    SiteCallStatus.FAILED: 4,
    SiteCallStatus.DISCARDED: 4,
}
TERMINAL_RANK = 4
TERMINAL: frozenset[SiteCallStatus] = frozenset(s for s, r in RANKS.items() if r == TERMINAL_RANK)
NON_TERMINAL: frozenset[SiteCallStatus] = frozenset(RANKS) - TERMINAL
BUFFERED: frozenset[SiteCallStatus] = NON_TERMINAL - {SiteCallStatus.PARKED}
"""Held by a site's buffer and still moving: neither terminal nor Parked."""


def rank(status: str) -> int:
    """The rank of ``status``; raises ``KeyError`` for an unknown status."""
    return RANKS[SiteCallStatus(status)]


def is_terminal(status: str) -> bool:
    return SiteCallStatus(status) in TERMINAL


class State(Protocol):
    """What the ordering reads of a site-call state."""

    @property
    def epoch(self) -> int: ...

    @property
    def status(self) -> str: ...

    @property
    def updated_at_utc(self) -> Stamp: ...


def ordering_key(state: State) -> tuple[int, int, Stamp]:
    """``(epoch, rank, updated_at_utc)`` of ``state``."""
    return (state.epoch, rank(state.status), state.updated_at_utc)


def supersedes(incoming: State, stored: State) -> bool:
    """True when ``incoming`` replaces ``stored`` under the monotonic rule (module doc)."""
    if incoming.epoch != stored.epoch:
        return incoming.epoch > stored.epoch
    incoming_rank, stored_rank = rank(incoming.status), rank(stored.status)
    if incoming_rank != stored_rank:
        return incoming_rank > stored_rank
    if stored_rank == TERMINAL_RANK:
        return False  # an equal terminal rank is immutable
    return incoming.updated_at_utc > stored.updated_at_utc


S = TypeVar("S", bound=State)


def fold_states(states: Iterable[S]) -> S:
    """The state that survives applying ``states`` in order (the first of equals wins).

    Raises ``ValueError`` for no states.
    """
    survivor: S | None = None
    for state in states:
        if survivor is None or supersedes(state, survivor):
            survivor = state
    if survivor is None:
        raise ValueError("no states to fold")
    return survivor
