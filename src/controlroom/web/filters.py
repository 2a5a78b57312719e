"""Jinja2 filters and globals of the console's templates: times, sizes, statuses, URLs.

Every filter returns plain text (autoescaped by the template), never markup.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, urlencode

import jinja2
from markupsafe import Markup, escape

from controlroom.db.tables import FailedMessageStatus
from controlroom.telemetry.stamps import Stamp

STATUS_LABELS: dict[FailedMessageStatus, str] = {
    FailedMessageStatus.UNRESOLVED: "Unresolved",
    FailedMessageStatus.RESOLVED: "Resolved",
    FailedMessageStatus.RETRY_ISSUED: "RetryIssued",
    FailedMessageStatus.ARCHIVED: "Archived",
}


def utc(instant: datetime | Stamp | None) -> str:
    """``2026-12-01 13:26:41 UTC``; a site's stamp (``Stamp``) to its 100 ns, as sites send
    it (``2026-12-01 13:26:41.1234567 UTC``); an empty string for ``None``."""
    if instant is None:
        return ""
    if isinstance(instant, Stamp):
        moment = instant.instant
        fraction = f".{moment.microsecond:06d}{instant.tick}"
    else:
        moment, fraction = instant.astimezone(UTC), ""
    return f"{moment.year:04d}-{moment:%m-%d %H:%M:%S}{fraction} UTC"  # not %Y: four digits


def iso(instant: datetime | Stamp | None) -> str:
    """ISO 8601 UTC for a ``<time datetime=...>`` attribute."""
    if isinstance(instant, Stamp):
        return instant.isoformat()
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


def age(seconds: float | None) -> str:
    """A duration in seconds for people: ``45 s``, ``12 min 05 s``, ``3 h 07 min``,
    ``2 d 04 h``; an empty string for ``None``."""
    if seconds is None:
        return ""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
    return f"{whole // 86400} d {whole % 86400 // 3600:02d} h"


def span(duration: timedelta) -> str:
    """A configured interval for a label: ``5 min``, ``1 h``, ``90 s``."""
    seconds = int(duration.total_seconds())
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def status_label(status: FailedMessageStatus | int) -> str:
    return STATUS_LABELS[FailedMessageStatus(status)]


def query(base: dict[str, object], **changes: object) -> str:
    """``?a=1&b=2``: ``base`` with ``changes`` applied; empty and ``None`` values dropped."""
    merged = {**base, **changes}
    kept = {key: value for key, value in merged.items() if value not in (None, "")}
    return "?" + urlencode(kept) if kept else "?"


_RELATED_PAGES: dict[str, str] = {
    "/message/": "/messages/{}",
    "/group/": "/messages?group={}",
    "/endpoint/": "/messages?endpoint={}",
    "/site/": "/site-calls?site={}",
    "/site-call/": "/site-calls/{}",
    "/notification/": "/notifications/{}",
    "/retry/": "/operations/{}",
}
"""The console page of each kind of event log ``related_to`` path (``controlroom.events``)."""


def related_link(path: str) -> str | None:
    """The console URL that shows what an event's ``related_to`` path names (a failed
    message, the messages of a group or endpoint, a site's calls, a site call, a
    notification, a retry operation), or ``None`` for a path no page shows. The name is
    percent-encoded: it came off the wire."""
    for prefix, page in _RELATED_PAGES.items():
        if path.startswith(prefix) and len(path) > len(prefix):
            return page.format(quote(path[len(prefix) :], safe=""))
    return None


_BREAK_AFTER = re.compile(r"([/.?&=_:-]+)")


def breakable(value: str | None) -> Markup:
    """``value`` escaped, with a line-break opportunity (``<wbr>``) after each run of URL
    punctuation (``/ . ? & = _ : -``), so a target wraps between its parts, not inside
    them (``None`` gives an empty string)."""
    if not value:
        return Markup("")
    return Markup("").join(
        Markup(f"{escape(part)}<wbr>") if _BREAK_AFTER.fullmatch(part) else escape(part)
        for part in _BREAK_AFTER.split(value)
        if part
    )


def counted(count: int, singular: str, plural: str | None = None) -> str:
    """``1 event``, ``4 events``: ``count`` and the noun in its number (``plural``
    defaults to ``singular`` + ``s``)."""
    return f"{count} {singular if count == 1 else plural or f'{singular}s'}"


def install(env: jinja2.Environment) -> None:
    env.filters.update(
        utc=utc,
        iso=iso,
        size=size,
        age=age,
        span=span,
        status_label=status_label,
        related_link=related_link,
        counted=counted,
        breakable=breakable,
    )
    env.globals.update(query=query)
