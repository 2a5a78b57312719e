"""What PostgreSQL's memory and WAL settings cost the write path (docs/decisions.md "The
write path's cost does not grow with the store").

Every message written inserts an entry at a random place of several indexes (the
messages' and their group rows' primary keys, the message and conversation ids, the
full-text index). While those indexes fit in shared buffers such an insert finds its page
there; once they outgrow it, every insert reads its page from outside (the OS cache or the
disk) and first writes out a dirty page to make room, so the CPU per message grows with
the store. And after every checkpoint, the first change of each page is logged whole (a
full-page image): checkpoints every 5 minutes or every 1 GB of WAL (PostgreSQL's
defaults) log most changed index pages whole, again and again.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

INDEXED_TABLES = ("failed_messages", "failed_message_groups")
"""The tables whose indexes every message written adds an entry to."""

MIN_MAX_WAL_SIZE = 4 * 2**30
"""``max_wal_size`` below this (bytes) warns: README "What the store needs" asks 8 GB."""

MIN_CHECKPOINT_TIMEOUT = 15 * 60
"""``checkpoint_timeout`` below this (seconds) warns: README "What the store needs"."""

HUGE_PAGES_FROM = 2**30
"""``shared_buffers`` from this size (bytes) up warns when not in huge pages: README "What
the store needs"."""

ADVICE = 'README, "What the store needs"'


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """The settings the warnings judge, and the size they are judged against."""

    shared_buffers: int  # bytes
    max_wal_size: int  # bytes
    checkpoint_timeout: int  # seconds
    index_bytes: int  # the indexes of INDEXED_TABLES, bytes
    huge_pages: str = "try"  # on, off or try
    huge_pages_status: str | None = None  # on, off or unknown; PostgreSQL 17+, else None


def read_server_settings(conn: sa.Connection) -> ServerSettings:
    """``ServerSettings`` of ``conn``'s server and database (``pg_settings``, in their
    units; ``pg_indexes_size``). Any user may read them."""
    rows = conn.execute(
        sa.text(
            "SELECT name, CAST(setting AS bigint) * CASE unit WHEN '8kB' THEN 8192 "
            "WHEN 'kB' THEN 1024 WHEN 'MB' THEN 1048576 WHEN 'min' THEN 60 ELSE 1 END "
            "FROM pg_settings "
            "WHERE name IN ('shared_buffers', 'max_wal_size', 'checkpoint_timeout')"
        )
    ).all()
    values = {name: int(value) for name, value in rows}
    pages = {
        str(name): str(setting)
        for name, setting in conn.execute(
            sa.text(
                "SELECT name, setting FROM pg_settings "
                "WHERE name IN ('huge_pages', 'huge_pages_status')"
            )
        )
    }
    index_bytes = conn.execute(
        sa.text(
            "SELECT coalesce(sum(pg_indexes_size(to_regclass(t))), 0) "
            "FROM unnest(CAST(:tables AS text[])) t WHERE to_regclass(t) IS NOT NULL"
        ),
        {"tables": list(INDEXED_TABLES)},
    ).scalar_one()
    return ServerSettings(
        values["shared_buffers"],
        values["max_wal_size"],
        values["checkpoint_timeout"],
        int(index_bytes),
        pages.get("huge_pages", "try"),
        pages.get("huge_pages_status"),
    )


def settings_warnings(settings: ServerSettings) -> list[str]:
    """Sentences, one per problem: shared buffers smaller than the indexes every write
    adds to, checkpoints closer than ``MIN_CHECKPOINT_TIMEOUT`` or ``MIN_MAX_WAL_SIZE``
    of WAL, shared buffers of ``HUGE_PAGES_FROM`` or more not in huge pages (``huge_pages
    = off``, or PostgreSQL 17's ``huge_pages_status`` off). Empty when the settings
    cost the write path nothing as the store grows."""
    warnings = []
    if settings.shared_buffers < settings.index_bytes:
        warnings.append(
            f"shared_buffers ({_size(settings.shared_buffers)}) is smaller than the indexes "
            f"of {' and '.join(INDEXED_TABLES)} ({_size(settings.index_bytes)}): every "
            "message written reads index pages from outside shared buffers and writes "
            "others out to make room, so the CPU per message grows with the store; set "
            f"shared_buffers to at least {_size(settings.index_bytes)} and about a quarter "
            f"of the server's memory ({ADVICE})"
        )
    if (
        settings.max_wal_size < MIN_MAX_WAL_SIZE
        or settings.checkpoint_timeout < MIN_CHECKPOINT_TIMEOUT
    ):
        warnings.append(
            f"checkpoints come every {settings.checkpoint_timeout // 60} min or "
            f"{_size(settings.max_wal_size)} of WAL (checkpoint_timeout, max_wal_size): after "
            "each one the first change of every page is logged whole, which a drain pays "
            "for most of the index pages it writes; set max_wal_size to at least "
            f"{_size(MIN_MAX_WAL_SIZE)} and checkpoint_timeout to at least "
            f"{MIN_CHECKPOINT_TIMEOUT // 60} min ({ADVICE})"
        )
    if settings.shared_buffers >= HUGE_PAGES_FROM and (
        settings.huge_pages == "off" or settings.huge_pages_status == "off"
    ):
        why = (
            "huge_pages is off"
            if settings.huge_pages == "off"
            else "huge pages are not in use (huge_pages_status)"
        )
        warnings.append(
            f"{why} for shared_buffers ({_size(settings.shared_buffers)}): in 4 kB pages "
            "every index lookup of a large store misses the CPU's address cache, and the "
            "CPU PostgreSQL spends per message written grows with the store; reserve huge "
            "pages (vm.nr_hugepages, at least SHOW shared_memory_size_in_huge_pages) and "
            f"set huge_pages to on or try ({ADVICE})"
        )
    return warnings


def server_settings_warnings(conn: sa.Connection) -> list[str]:
    """``settings_warnings`` of ``conn``'s server and database."""
    return settings_warnings(read_server_settings(conn))


def _size(value: int) -> str:
    """``value`` bytes as PostgreSQL writes a size: ``128 MB``, ``4 GB``."""
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if value >= size:
            amount = value / size
            whole = amount >= 10 or amount.is_integer()
            return f"{amount:.0f} {unit}" if whole else f"{amount:.1f} {unit}"
    return f"{value} bytes"
