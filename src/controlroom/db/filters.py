"""The conditions a keyset-paged list of site calls or notifications filters by.

Both lists take equality filters (``None``: not filtered) and a created range, ``from``
inclusive and ``to`` exclusive (UTC); this builds them once for both.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa


def filter_conditions(
    equal: Iterable[tuple[sa.ColumnElement[Any], object]],
    created: sa.ColumnElement[datetime],
    created_from: datetime | None,
    created_to: datetime | None,
) -> list[sa.ColumnElement[bool]]:
    """``column == value`` for each pair of ``equal`` whose value is not ``None``, then
    ``created >= created_from`` and ``created < created_to`` where given."""
    conditions = [column == value for column, value in equal if value is not None]
    if created_from is not None:
        conditions.append(created >= created_from)
    if created_to is not None:
        conditions.append(created < created_to)
    return conditions
