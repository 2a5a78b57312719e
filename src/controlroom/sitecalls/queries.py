"""Reading the site-call half: site calls, one call with its audit events, the audit log,
rejected telemetry — each newest first with keyset paging.

Source: docs/decisions.md "Site-call lists page by keyset" (``db.keyset``, shared with
the notification outbox's list). A page ends with a cursor naming its last row's sort
key (``(created_at_utc, created_at_tick, tracked_operation_id)``, ``(occurred_at_utc,
occurred_at_tick, event_id)``: the stamps to 100 ns, as sites send them; or
``(rejected_at_utc, id)``); the next page is the rows strictly after it in the same
order, so rows sharing one instant are neither repeated nor skipped. Each order's
instant leads an index of migration 0005; what shares one microsecond is sorted within
it. Filter values are only ever bound parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from controlroom.db.filters import filter_conditions, stamp_range
from controlroom.db.keyset import BadCursor as BadCursor
from controlroom.db.keyset import Page as Page
from controlroom.db.keyset import keyset_page
from controlroom.db.tables import (
    REJECTED_NOTIFICATION_SOURCE,
    audit_log,
    rejected_telemetry,
    site_calls,
)
from controlroom.telemetry.stamps import Stamp, stamp_of

sc = site_calls.c
al = audit_log.c
rt = rejected_telemetry.c


SITE_CALL_STAMPS = ("created_at", "updated_at", "terminal_at")
"""The stamps a site sends of a call, each stored as ``{name}_utc`` and ``{name}_tick``."""
AUDIT_STAMPS = ("occurred_at",)


def with_stamps(row: sa.Row[Any], names: Sequence[str]) -> dict[str, Any]:
    """``row`` as a dict in which each stamp of ``names`` is one ``Stamp`` to 100 ns under
    ``{name}_utc`` (``None`` when null), its ``{name}_tick`` folded in."""
    values = row._asdict()
    for name in names:
        values[f"{name}_utc"] = stamp_of(row, name)
        del values[f"{name}_tick"]
    return values


@dataclass(frozen=True, slots=True)
class SiteCallFilter:
    """Filters of ``GET /api/site-calls``; ``None`` means any. Stamps to 100 ns."""

    site: str | None = None
    node: str | None = None
    status: str | None = None
    channel: str | None = None
    target: str | None = None
    created_from: Stamp | None = None
    created_to: Stamp | None = None


def list_site_calls(
    conn: sa.Connection, filters: SiteCallFilter, *, limit: int, after: str | None
) -> Page:
    """Site calls newest created first, ``limit`` per page. Raises ``BadCursor``."""
    conditions = filter_conditions(
        (
            (sc.source_site, filters.site),
            (sc.source_node, filters.node),
            (sc.status, filters.status),
            (sc.channel, filters.channel),
            (sc.target, filters.target),
        ),
    ) + stamp_range(sc.created_at_utc, sc.created_at_tick, filters.created_from, filters.created_to)
    return keyset_page(
        conn,
        sa.select(site_calls),
        (sc.created_at_utc, sc.created_at_tick, sc.tracked_operation_id),
        conditions,
        limit=limit,
        after=after,
    )


def get_site_call(
    conn: sa.Connection, tracked_operation_id: str
) -> sa.Row[*tuple[Any, ...]] | None:
    return conn.execute(
        sa.select(site_calls).where(sc.tracked_operation_id == tracked_operation_id)
    ).one_or_none()


def audit_events_of(
    conn: sa.Connection, tracked_operation_id: str
) -> list[sa.Row[*tuple[Any, ...]]]:
    """The audit events correlated with a site call, oldest first (to the 100 ns)."""
    return list(
        conn.execute(
            sa.select(audit_log)
            .where(al.correlation_id == tracked_operation_id)
            .order_by(al.occurred_at_utc, al.occurred_at_tick, al.event_id)
        ).all()
    )


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Filters of ``GET /api/audit-log``; ``None`` means any. Stamps to 100 ns."""

    actor: str | None = None
    action: str | None = None
    outcome: str | None = None
    category: str | None = None
    target: str | None = None
    correlation_id: str | None = None
    occurred_from: Stamp | None = None
    occurred_to: Stamp | None = None


def list_audit_events(
    conn: sa.Connection, filters: AuditFilter, *, limit: int, after: str | None
) -> Page:
    """Audit events newest first, ``limit`` per page. Raises ``BadCursor``."""
    conditions = filter_conditions(
        (
            (al.actor, filters.actor),
            (al.action, filters.action),
            (al.outcome, filters.outcome),
            (al.category, filters.category),
            (al.target, filters.target),
            (al.correlation_id, filters.correlation_id),
        )
    ) + stamp_range(
        al.occurred_at_utc, al.occurred_at_tick, filters.occurred_from, filters.occurred_to
    )
    return keyset_page(
        conn,
        sa.select(audit_log),
        (al.occurred_at_utc, al.occurred_at_tick, al.event_id),
        conditions,
        limit=limit,
        after=after,
    )


PACKET_PREVIEW_BYTES = 2048
"""Bytes of a rejected packet a list shows; the whole packet is ``rejected_packet``'s."""


def list_rejected_telemetry(
    conn: sa.Connection, *, limit: int, after: str | None, notifications: bool = False
) -> Page:
    """Rejected packets newest first, each with ``id``, ``source``, ``reason``,
    ``rejected_at_utc``, ``packet`` (its first ``PACKET_PREVIEW_BYTES`` bytes: a packet may
    be megabytes) and ``packet_size`` (bytes): telemetry, or with ``notifications`` the
    rejected notifications (source ``REJECTED_NOTIFICATION_SOURCE...``). Raises
    ``BadCursor``."""
    preview = sa.select(
        rt.id,
        rt.source,
        rt.reason,
        rt.rejected_at_utc,
        # SQLite's substr of an empty blob is NULL: an empty packet's preview is empty.
        sa.func.coalesce(
            sa.func.substr(rt.packet, 1, PACKET_PREVIEW_BYTES, type_=sa.LargeBinary),
            sa.literal(b"", sa.LargeBinary),
        ).label("packet"),
        sa.func.length(rt.packet).label("packet_size"),
    ).subquery("rejected_preview")
    kind = preview.c.source.startswith(REJECTED_NOTIFICATION_SOURCE, autoescape=True)
    return keyset_page(
        conn,
        sa.select(preview),
        (preview.c.rejected_at_utc, preview.c.id),
        [kind if notifications else sa.not_(kind)],
        limit=limit,
        after=after,
    )


def rejected_packet(
    conn: sa.Connection, rejected_id: str, *, notifications: bool | None = None
) -> bytes | None:
    """The whole packet kept as rejected telemetry ``rejected_id``, as received; ``None``
    without one. ``notifications``: ``True`` only a rejected notification's, ``False``
    only telemetry's, ``None`` either (``list_rejected_telemetry``'s kinds)."""
    query = sa.select(rt.packet).where(rt.id == rejected_id)
    if notifications is not None:
        kind = rt.source.startswith(REJECTED_NOTIFICATION_SOURCE, autoescape=True)
        query = query.where(kind if notifications else sa.not_(kind))
    packet: bytes | None = conn.execute(query).scalar_one_or_none()
    return None if packet is None else bytes(packet)


def rejected_reason(conn: sa.Connection, rejected_id: str) -> str | None:
    """The reason the rejected packet ``rejected_id`` is kept for; ``None`` without one."""
    return conn.execute(sa.select(rt.reason).where(rt.id == rejected_id)).scalar_one_or_none()
