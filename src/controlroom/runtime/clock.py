"""The clock every part reads: ``utc_now`` and the ``Clock`` type tests replace it with."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]
"""A function answering the current time, timezone-aware, in UTC."""


def utc_now() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)
