"""What the store's PostgreSQL memory and WAL settings cost the write path, in words
(docs/decisions.md "The write path's cost does not grow with the store"): judged from the
settings and the size of the indexes every write adds to, without a server."""

from __future__ import annotations

from controlroom.db.providers._postgresql_settings import ServerSettings, settings_warnings

GB = 2**30
MB = 2**20

PRODUCTION = ServerSettings(
    shared_buffers=4 * GB, max_wal_size=8 * GB, checkpoint_timeout=15 * 60, index_bytes=3 * GB
)
"""README "What the store needs" on a store whose indexes fit its shared buffers."""


def test_production_settings_over_indexes_that_fit_warn_of_nothing() -> None:
    assert settings_warnings(PRODUCTION) == []


def test_shared_buffers_smaller_than_the_indexes_warn_saying_both_sizes_and_the_cost() -> None:
    settings = ServerSettings(128 * MB, 8 * GB, 15 * 60, index_bytes=2560 * MB)

    (warning,) = settings_warnings(settings)

    assert "shared_buffers (128 MB)" in warning
    assert "failed_messages and failed_message_groups (2.5 GB)" in warning
    assert "grows with the store" in warning
    assert "at least 2.5 GB" in warning and "What the store needs" in warning


def test_an_empty_store_warns_of_no_shared_buffers_however_small() -> None:
    settings = ServerSettings(128 * MB, 8 * GB, 15 * 60, index_bytes=2 * MB)

    assert settings_warnings(settings) == []


def test_postgresqls_default_checkpoint_distance_warns_once_naming_both_settings() -> None:
    defaults = ServerSettings(4 * GB, 1 * GB, 5 * 60, index_bytes=0)

    (warning,) = settings_warnings(defaults)

    assert "every 5 min or 1 GB of WAL" in warning
    assert "logged whole" in warning
    assert "max_wal_size to at least 4 GB" in warning
    assert "checkpoint_timeout to at least 15 min" in warning


def test_either_checkpoint_setting_alone_below_its_floor_warns() -> None:
    small_wal = ServerSettings(4 * GB, 2 * GB, 30 * 60, index_bytes=0)
    short_timeout = ServerSettings(4 * GB, 16 * GB, 10 * 60, index_bytes=0)

    assert len(settings_warnings(small_wal)) == 1
    assert len(settings_warnings(short_timeout)) == 1


def test_large_shared_buffers_without_huge_pages_warn_saying_how_to_size_them() -> None:
    """benchmarks/README.md "Huge pages, side by side": into a store of 1,000,000 messages
    PostgreSQL's CPU per message grew 1.42x over an empty store's in 4 kB pages, 1.17x in
    huge pages."""
    without = ServerSettings(11 * GB, 8 * GB, 15 * 60, index_bytes=10 * GB, huge_pages="off")

    (warning,) = settings_warnings(without)

    assert "huge_pages is off" in warning and "shared_buffers (11 GB)" in warning
    assert "shared_memory_size_in_huge_pages" in warning and "vm.nr_hugepages" in warning


def test_huge_pages_on_tried_or_in_use_or_small_shared_buffers_warn_of_nothing() -> None:
    big = {"shared_buffers": 11 * GB, "max_wal_size": 8 * GB, "checkpoint_timeout": 900}
    for huge_pages, status in (("on", None), ("try", None), ("try", "on"), ("on", "on")):
        settings = ServerSettings(
            **big, index_bytes=GB, huge_pages=huge_pages, huge_pages_status=status
        )
        assert settings_warnings(settings) == [], (huge_pages, status)
    small = ServerSettings(512 * MB, 8 * GB, 900, index_bytes=0, huge_pages="off")
    assert settings_warnings(small) == []


def test_huge_pages_tried_but_not_in_use_warn_where_the_server_says_so() -> None:
    """PostgreSQL 17 and later state ``huge_pages_status``; under ``try`` it may be off."""
    settings = ServerSettings(
        11 * GB, 8 * GB, 900, index_bytes=GB, huge_pages="try", huge_pages_status="off"
    )
    (warning,) = settings_warnings(settings)
    assert "huge pages are not in use" in warning
