"""The failed-message filters an operator writes as text, read the way ServiceControl
reads them: status names (``unresolved,-archived``) and time ranges (``<from>...<to>``).

The API's query parameters (``controlroom.api.parameters``) and the console's list
filters (``controlroom.web.pages``) both read them here. Pure: no I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from controlroom.db.tables import FailedMessageStatus

StatusName = Literal["unresolved", "resolved", "retryIssued", "archived"]

STATUS_NAMES: dict[FailedMessageStatus, StatusName] = {
    FailedMessageStatus.UNRESOLVED: "unresolved",
    FailedMessageStatus.RESOLVED: "resolved",
    FailedMessageStatus.RETRY_ISSUED: "retryIssued",
    FailedMessageStatus.ARCHIVED: "archived",
}
# The ``status`` filter reads names case-insensitively (``retryissued`` or ``retryIssued``).
_STATUS_BY_NAME = {name.lower(): status for status, name in STATUS_NAMES.items()}

RANGE_SEPARATOR = "..."


def parse_status_filter(
    text: str,
) -> tuple[frozenset[FailedMessageStatus], frozenset[FailedMessageStatus]]:
    """``"unresolved,-archived"`` -> (statuses to include, statuses to exclude).

    Comma-separated names, case-insensitive, spaces ignored; a ``-`` prefix excludes. An
    unknown name is ignored, as ServiceControl ignores it (``FilterByStatusWhere``): a
    filter of unknown names only is no filter.
    """
    include: set[FailedMessageStatus] = set()
    exclude: set[FailedMessageStatus] = set()
    for part in text.replace(" ", "").split(","):
        excluded = part.startswith("-")
        name = part[1:] if excluded else part
        status = _STATUS_BY_NAME.get(name.lower())
        if status is not None:
            (exclude if excluded else include).add(status)
    return frozenset(include), frozenset(exclude)


def parse_modified_range(text: str) -> tuple[datetime | None, datetime | None]:
    """``"<ISO from>...<ISO to>"`` -> (from, to), both inclusive, timezone-aware UTC.

    A time without an offset is UTC. One side may be empty (no bound there), not both.
    Source: ServiceControl ``FilterByLastModifiedRange``. Raises ``ValueError`` for a
    missing ``...``, an unreadable time, two empty sides, or ``from`` after ``to``.
    """
    start_text, separator, end_text = text.partition(RANGE_SEPARATOR)
    if not separator:
        raise ValueError(
            "expected '<from>...<to>' with ISO 8601 times, "
            "e.g. 2026-01-01T00:00:00Z...2026-01-31T23:59:59Z"
        )
    start = _parse_instant(start_text, "from")
    end = _parse_instant(end_text, "to")
    if start is None and end is None:
        raise ValueError("the range needs a 'from' or a 'to' time")
    if start is not None and end is not None and start > end:
        raise ValueError("'from' is after 'to'")
    return start, end


def _parse_instant(text: str, side: str) -> datetime | None:
    text = text.strip()
    if not text:
        return None
    # An unencoded "+" of an offset arrives as a space: read it back as "+".
    candidates = [text] if " " not in text else [text, "+".join(text.rsplit(" ", 1))]
    for candidate in candidates:
        try:
            instant = datetime.fromisoformat(candidate)
        except ValueError:
            continue
        return utc_instant(instant, side)
    raise ValueError(f"the {side!r} time {text[:50]!r} is not an ISO 8601 time")


def utc_instant(instant: datetime, side: str) -> datetime:
    """``instant`` in UTC (without a zone: UTC already); raises ``ValueError`` naming
    ``side`` when its offset takes it before year 1 or after 9999 in UTC."""
    if instant.tzinfo is None:
        return instant.replace(tzinfo=UTC)
    try:
        return instant.astimezone(UTC)
    except OverflowError:
        raise ValueError(
            f"the {side!r} time {instant.isoformat()!r} is out of range in UTC (its offset "
            "takes it before year 1 or after 9999)"
        ) from None
