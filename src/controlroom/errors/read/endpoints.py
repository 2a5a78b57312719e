"""Known endpoints: the endpoint instances seen on failed messages, and the user's
``monitored`` flag on each.

Ingestion only ever inserts a known endpoint (docs/design.md "Writer", step 3: never update
one, ``monitored`` is the user's); the functions here are the only writers of an existing
row. SQLAlchemy Core, on the caller's ``Connection``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from controlroom.db.tables import known_endpoints

ke = known_endpoints.c


@dataclass(frozen=True, slots=True)
class KnownEndpointRow:
    """One endpoint instance: a name on a host."""

    id: str  # identity.known_endpoint_id(name, host_id)
    name: str
    host_id: str
    host: str | None
    monitored: bool
    first_seen_at: datetime


@dataclass(frozen=True, slots=True)
class KnownEndpointPage:
    total: int
    items: list[KnownEndpointRow]


def list_known_endpoints(conn: sa.Connection, *, offset: int, limit: int) -> KnownEndpointPage:
    """Known endpoints by name, then host id, then id; ``limit`` rows from ``offset``.

    Raises ``ValueError`` for a negative ``offset`` or a ``limit`` below 1.
    """
    if offset < 0 or limit < 1:
        raise ValueError(f"offset must be >= 0 and limit >= 1, got {offset} and {limit}")
    total = conn.execute(sa.select(sa.func.count()).select_from(known_endpoints)).scalar_one()
    rows = conn.execute(
        sa.select(ke.id, ke.name, ke.host_id, ke.host, ke.monitored, ke.first_seen_at)
        .order_by(ke.name, ke.host_id, ke.id)
        .limit(limit)
        .offset(offset)
    ).all()
    return KnownEndpointPage(total=total, items=[KnownEndpointRow(**row._asdict()) for row in rows])


def all_known_endpoints(conn: sa.Connection) -> list[KnownEndpointRow]:
    """Every known endpoint, by name, then host id, then id (one row per endpoint
    instance; a system has tens to hundreds, so no paging, as in ServiceControl)."""
    rows = conn.execute(
        sa.select(ke.id, ke.name, ke.host_id, ke.host, ke.monitored, ke.first_seen_at).order_by(
            ke.name, ke.host_id, ke.id
        )
    ).all()
    return [KnownEndpointRow(**row._asdict()) for row in rows]


def set_monitored(conn: sa.Connection, endpoint_id: str, monitored: bool) -> bool:
    """Set the user's ``monitored`` flag of ``endpoint_id``; False when there is no such
    endpoint."""
    result = conn.execute(
        sa.update(known_endpoints).where(ke.id == endpoint_id).values(monitored=monitored)
    )
    return result.rowcount > 0


def delete_known_endpoint(conn: sa.Connection, endpoint_id: str) -> bool:
    """Forget ``endpoint_id``; False when there is no such endpoint. Its failed messages
    stay; a later failure from it makes it known again, unmonitored."""
    result = conn.execute(sa.delete(known_endpoints).where(ke.id == endpoint_id))
    return result.rowcount > 0
