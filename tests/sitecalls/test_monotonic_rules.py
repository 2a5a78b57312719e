"""The monotonic upsert's rules, on every provider (docs/design.md "Monotonic upsert")."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from controlroom.sitecalls.writer import SiteCallWriter
from tests.sitecalls.packets import T0, packet, stored, write


@pytest.fixture
def site_writer(engine: sa.Engine) -> SiteCallWriter:
    return SiteCallWriter(engine)


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_first_packet_inserts_the_row(engine, site_writer) -> None:
    assert write(site_writer, packet("Submitted", at=at(1))) == [None]
    row = stored(engine)
    assert (row.status, row.epoch, row.updated_at_utc) == ("Submitted", 0, at(1))


def test_delivered_after_failed_is_a_no_op(engine, site_writer) -> None:
    write(site_writer, packet("Failed", at=at(5), last_error="boom"))
    write(site_writer, packet("Delivered", at=at(9)))
    row = stored(engine)
    assert (row.status, row.last_error, row.updated_at_utc) == ("Failed", "boom", at(5))


def test_discarded_after_parked_applies(engine, site_writer) -> None:
    write(site_writer, packet("Parked", at=at(5)))
    write(site_writer, packet("Discarded", at=at(6)))
    assert stored(engine).status == "Discarded"


def test_a_lower_rank_is_a_no_op(engine, site_writer) -> None:
    write(site_writer, packet("Attempted", at=at(5), retry_count=2))
    write(site_writer, packet("Forwarded", at=at(9)))
    row = stored(engine)
    assert (row.status, row.retry_count) == ("Attempted", 2)


def test_equal_stamps_are_a_no_op(engine, site_writer) -> None:
    write(site_writer, packet("Attempted", at=at(5), retry_count=1, last_error="first"))
    write(site_writer, packet("Attempted", at=at(5), retry_count=9, last_error="second"))
    row = stored(engine)
    assert (row.retry_count, row.last_error) == (1, "first")


def test_newer_equal_non_terminal_rank_stays_live(engine, site_writer) -> None:
    write(site_writer, packet("Attempted", at=at(5), retry_count=1, http_status=503))
    write(site_writer, packet("Skipped", at=at(6), retry_count=2, http_status=429))
    row = stored(engine)
    assert (row.status, row.retry_count, row.http_status) == ("Skipped", 2, 429)


@pytest.mark.parametrize("delivered_status", [None, 204])
@pytest.mark.parametrize("one_batch", [False, True])
def test_a_delivered_packet_replaces_an_earlier_attempts_http_status(
    engine, site_writer, delivered_status: int | None, one_batch: bool
) -> None:
    """A null ``http_status`` clears the stored 503 rather than keeping it (docs/decisions.md
    "A Delivered call's http_status is its delivering attempt's")."""
    failed = packet("Attempted", at=at(5), retry_count=2, last_error="HTTP 503", http_status=503)
    delivered = packet("Delivered", at=at(6), retry_count=2, http_status=delivered_status)
    if one_batch:
        write(site_writer, failed, delivered)
    else:
        write(site_writer, failed)
        assert stored(engine).http_status == 503
        write(site_writer, delivered)
    row = stored(engine)
    assert (row.status, row.last_error, row.http_status) == ("Delivered", None, delivered_status)


def test_a_new_epochs_submitted_after_parked_applies(engine, site_writer) -> None:
    write(site_writer, packet("Parked", at=at(5)))
    write(site_writer, packet("Submitted", at=at(7), epoch=1))
    row = stored(engine)
    assert (row.status, row.epoch) == ("Submitted", 1)
    # A stale packet of the older epoch is still rejected.
    write(site_writer, packet("Delivered", at=at(8), epoch=0))
    assert stored(engine).status == "Submitted"


def test_duplicates_in_one_batch_fold_to_the_survivor(engine, site_writer) -> None:
    write(
        site_writer,
        packet("Forwarded", at=at(2)),
        packet("Delivered", at=at(4)),
        packet("Attempted", at=at(3)),
        packet("Failed", at=at(5)),
    )
    assert stored(engine).status == "Delivered"


def test_the_upsert_guard_never_moves_a_call_to_another_site(engine, site_writer) -> None:
    # The statement itself holds the owner, so a writer racing past the owner check (it
    # read no row yet) still cannot take the call over.
    from controlroom.db.providers import provider_for
    from controlroom.sitecalls.upsert import upsert_site_calls
    from controlroom.sitecalls.writer import site_call_row
    from controlroom.telemetry.contract import validate_packet

    write(site_writer, packet("Attempted", at=at(1)))
    foreign = validate_packet(packet("Parked", at=at(9), epoch=7, source_site="intruder"))
    with engine.begin() as conn:
        written = upsert_site_calls(conn, provider_for(engine), [site_call_row(foreign, T0)])
    assert written == set()
    row = stored(engine)
    assert (row.source_site, row.status, row.epoch) == ("site-a", "Attempted", 0)
