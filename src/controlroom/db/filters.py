"""The conditions a keyset-paged list of site calls, audit events or notifications
filters by.

The lists take equality filters (``None``: not filtered) and a time range, ``from``
inclusive and ``to`` exclusive (UTC); this builds them once for all. A site's stamps are
read to 100 ns (``stamp_range``: docs/design.md "Stamps"), central's own times to the
microsecond (``filter_conditions``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from controlroom.telemetry.stamps import Stamp


def filter_conditions(
    equal: Iterable[tuple[sa.ColumnElement[Any], object]],
    created: sa.ColumnElement[datetime] | None = None,
    created_from: datetime | None = None,
    created_to: datetime | None = None,
) -> list[sa.ColumnElement[bool]]:
    """``column == value`` for each pair of ``equal`` whose value is not ``None``, then
    ``created >= created_from`` and ``created < created_to`` where given."""
    conditions = [column == value for column, value in equal if value is not None]
    if created is not None and created_from is not None:
        conditions.append(created >= created_from)
    if created is not None and created_to is not None:
        conditions.append(created < created_to)
    return conditions


def stamp_range(
    instant: sa.ColumnElement[datetime],
    tick: sa.ColumnElement[int],
    start: Stamp | None,
    end: Stamp | None,
) -> list[sa.ColumnElement[bool]]:
    """``start <= stamp < end`` where given, for a stamp kept in ``instant`` and ``tick``
    (``telemetry.stamps``), to 100 ns. Each bound is a range on ``instant`` first, so its
    index still bounds the scan; the tick decides only within the bound's microsecond."""
    conditions: list[sa.ColumnElement[bool]] = []
    if start is not None:
        conditions.append(instant >= start.instant)
        if start.tick:
            conditions.append(sa.or_(instant > start.instant, tick >= start.tick))
    if end is not None:
        if end.tick:
            conditions.append(instant <= end.instant)
            conditions.append(sa.or_(instant < end.instant, tick < end.tick))
        else:
            conditions.append(instant < end.instant)
    return conditions
