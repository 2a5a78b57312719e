"""Message redirects: retries of messages that failed in one queue go to another.

ServiceControl's redirects (``MessageRedirectsController``): one redirect per
from-address, its id the deterministic id of that address; a redirect to an address that
is itself redirected is refused, as is one from an address other redirects point to
("dependents"). A retry honours the redirect of the queue its message failed in
(``errors.retries``). SQLAlchemy Core on the caller's ``Connection``; addresses are
compared exactly, as ServiceControl compares them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa

from controlroom.db.tables import message_redirects
from controlroom.errors.ingest.identity import deterministic_id

mr = message_redirects.c

RedirectSortKey = Literal["from_physical_address", "to_physical_address"]


@dataclass(frozen=True, slots=True)
class Redirect:
    """One redirect: messages that failed in ``from_address`` are retried to ``to_address``."""

    id: str
    from_address: str
    to_address: str
    last_modified: datetime


@dataclass(frozen=True, slots=True)
class RedirectPage:
    total: int
    items: list[Redirect]


def redirect_id(from_address: str) -> str:
    """ServiceControl's ``MessageRedirectId``: the deterministic id of the from-address."""
    return deterministic_id(from_address)


def list_redirects(
    conn: sa.Connection,
    *,
    offset: int,
    limit: int,
    sort: RedirectSortKey = "from_physical_address",
    descending: bool = True,
) -> RedirectPage:
    """Redirects ordered by ``sort`` (then id), ``limit`` from ``offset``, with the total."""
    column = mr.to_physical_address if sort == "to_physical_address" else mr.from_physical_address
    order = [column.desc(), mr.id.desc()] if descending else [column.asc(), mr.id.asc()]
    total = conn.execute(sa.select(sa.func.count()).select_from(message_redirects)).scalar_one()
    rows = conn.execute(
        sa.select(mr.id, mr.from_physical_address, mr.to_physical_address, mr.last_modified)
        .order_by(*order)
        .limit(limit)
        .offset(offset)
    ).all()
    return RedirectPage(total=int(total), items=[_redirect(row) for row in rows])


def count_redirects(conn: sa.Connection) -> int:
    return int(conn.execute(sa.select(sa.func.count()).select_from(message_redirects)).scalar_one())


def get_redirect(conn: sa.Connection, redirect_id_: str) -> Redirect | None:
    row = conn.execute(
        sa.select(mr.id, mr.from_physical_address, mr.to_physical_address, mr.last_modified).where(
            mr.id == redirect_id_
        )
    ).one_or_none()
    return _redirect(row) if row is not None else None


def redirects_to(conn: sa.Connection, address: str) -> list[Redirect]:
    """The redirects whose destination is ``address`` (its "dependents")."""
    rows = conn.execute(
        sa.select(mr.id, mr.from_physical_address, mr.to_physical_address, mr.last_modified)
        .where(mr.to_physical_address == address)
        .order_by(mr.from_physical_address)
    ).all()
    return [_redirect(row) for row in rows]


def create_redirect(
    conn: sa.Connection, from_address: str, to_address: str, now: datetime
) -> Redirect:
    """Insert a redirect; the caller checked there is none from ``from_address``."""
    redirect = Redirect(redirect_id(from_address), from_address, to_address, now)
    conn.execute(
        sa.insert(message_redirects).values(
            id=redirect.id,
            from_physical_address=from_address,
            to_physical_address=to_address,
            last_modified=now,
        )
    )
    return redirect


def change_redirect(conn: sa.Connection, redirect_id_: str, to_address: str, now: datetime) -> bool:
    """Point redirect ``redirect_id_`` at ``to_address``; False when there is no such one."""
    changed = conn.execute(
        sa.update(message_redirects)
        .where(mr.id == redirect_id_)
        .values(to_physical_address=to_address, last_modified=now)
    ).rowcount
    return changed > 0


def delete_redirect(conn: sa.Connection, redirect_id_: str) -> None:
    """Remove redirect ``redirect_id_`` (nothing when there is none)."""
    conn.execute(sa.delete(message_redirects).where(mr.id == redirect_id_))


def redirect_targets(conn: sa.Connection, addresses: Iterable[str]) -> dict[str, str]:
    """``{from address: to address}`` for the redirected ones among ``addresses``."""
    wanted = sorted(set(addresses))
    if not wanted:
        return {}
    rows = conn.execute(
        sa.select(mr.from_physical_address, mr.to_physical_address).where(
            mr.from_physical_address.in_(wanted)
        )
    ).all()
    return {row.from_physical_address: row.to_physical_address for row in rows}


def _redirect(row: sa.Row[*tuple[Any, ...]]) -> Redirect:
    return Redirect(
        id=row.id,
        from_address=row.from_physical_address,
        to_address=row.to_physical_address,
        last_modified=row.last_modified,
    )
