"""Column types shared by every provider."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa


class UtcDateTime(sa.types.TypeDecorator[datetime]):
    """A UTC instant: stored naive (in UTC), returned timezone-aware (UTC).

    Naive storage keeps SQLite's text form sortable and comparable inside SQL guards
    (``YYYY-MM-DD HH:MM:SS.ffffff``); aware values are converted to UTC on the way in.
    Raises ``ValueError`` for a naive ``datetime``: an instant must say its zone.
    """

    impl = sa.DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("UtcDateTime needs a timezone-aware datetime")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC)
