"""The reconciliation cursor's rules, as pure functions (no I/O).

Source: docs/design.md "Reconciliation"; docs/decisions.md "Pulls are strictly after a
composite cursor". A pull asks a site for its rows changed
strictly after the composite cursor ``(updated_at_utc, tracked_operation_id)``; the
cursor advances to the greatest pair seen and never moves back. A site that honours
``after_id`` always returns rows strictly after the cursor, so each page with rows
advances it, and a burst of rows sharing one stamp drains page by page through the id
tiebreak. A legacy site ignores ``after_id`` and answers from ``since`` inclusive: when more
rows share one stamp than a page holds, it keeps answering the same page with
``more_available`` while the cursor cannot advance. That site is **pinned**: the pass
stops pulling it, and the latch holds until a later pass advances (``pin_change``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from controlroom.telemetry.stamps import Stamp

Cursor = tuple[Stamp, str]
"""``(updated_at_utc, tracked_operation_id)`` of the last row pulled from a site; the
stamp to 100 ns as the site sent it, so rows sharing a microsecond still order."""


@dataclass(frozen=True, slots=True)
class PageVerdict:
    """What one page means: the cursor after it, whether it moved, and whether the site
    is stuck (more rows, none past the cursor)."""

    cursor: Cursor | None
    advanced: bool
    stuck: bool


def judge_page(cursor: Cursor | None, keys: list[Cursor], more_available: bool) -> PageVerdict:
    """The verdict on a page whose rows have ``keys``, pulled from ``cursor``."""
    greatest = max(keys, default=None)
    advanced = greatest is not None and (cursor is None or greatest > cursor)
    new = greatest if advanced else cursor
    return PageVerdict(new, advanced, stuck=more_available and not advanced)


class PinChange(enum.Enum):
    """A change of a site's pinned latch: the only times an event is raised."""

    LATCHED = "latched"
    CLEARED = "cleared"


def pin_change(was_pinned: bool, *, stuck: bool, progressed: bool) -> PinChange | None:
    """The latch's change after a pass that ended ``stuck`` or not, having ``progressed``
    (advanced the cursor, or drained the site) or not; ``None`` when the latch stays as
    it was (no event). A pass that failed is not judged."""
    if stuck and not was_pinned:
        return PinChange.LATCHED
    if was_pinned and progressed and not stuck:
        return PinChange.CLEARED
    return None
