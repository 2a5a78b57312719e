"""Jinja2 filters and globals of the console's templates: times, sizes, statuses, URLs.

Every filter returns plain text (autoescaped by the template), never markup.
"""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import urlencode

import jinja2

from controlroom.db.tables import FailedMessageStatus

STATUS_LABELS: dict[FailedMessageStatus, str] = {
    FailedMessageStatus.UNRESOLVED: "Unresolved",
    FailedMessageStatus.RESOLVED: "Resolved",
    FailedMessageStatus.RETRY_ISSUED: "RetryIssued",
    FailedMessageStatus.ARCHIVED: "Archived",
}


def utc(instant: datetime | None) -> str:
    """``2026-12-01 13:26:41 UTC``; an empty string for ``None``."""
    if instant is None:
        return ""
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(instant: datetime | None) -> str:
    """ISO 8601 UTC for a ``<time datetime=...>`` attribute."""
    return "" if instant is None else instant.astimezone(UTC).isoformat()


def size(count: int | None) -> str:
    """A byte count for people: ``812 B``, ``12.4 KiB``, ``3.1 MiB``."""
    if count is None:
        return ""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def status_label(status: FailedMessageStatus | int) -> str:
    return STATUS_LABELS[FailedMessageStatus(status)]


def query(base: dict[str, object], **changes: object) -> str:
    """``?a=1&b=2``: ``base`` with ``changes`` applied; empty and ``None`` values dropped."""
    merged = {**base, **changes}
    kept = {key: value for key, value in merged.items() if value not in (None, "")}
    return "?" + urlencode(kept) if kept else "?"


def install(env: jinja2.Environment) -> None:
    env.filters.update(utc=utc, iso=iso, size=size, status_label=status_label)
    env.globals.update(query=query)
