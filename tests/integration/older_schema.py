"""Writing to a store downgraded below migration 0020, as the tests of older migrations do.

Below 0020 a group row has 0011's copies of its message only (``status``,
``first_failure_at``, ``last_failure_at``); today's writer inserts 0020's too. Within
``group_copies_before_0020()`` the writer inserts group rows with 0011's copies, as it did
when the schema was that old.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from controlroom.errors.ingest import writer

COPIES_BEFORE_0020 = ("status", "first_failure_at", "last_failure_at")


@contextmanager
def group_copies_before_0020() -> Iterator[None]:
    """The writer's group rows carry 0011's copies only, until the block ends."""
    copies = writer.GROUP_COPIES
    writer.GROUP_COPIES = COPIES_BEFORE_0020
    writer.group_rows_statement.cache_clear()  # built once per provider: built again
    try:
        yield
    finally:
        writer.GROUP_COPIES = copies
        writer.group_rows_statement.cache_clear()
