"""The site's tracking store holds a call's state in the widths central stores it in,
both declared from the telemetry contract: nothing the site keeps is refused at central
for its length, and every status and channel fits its column."""

from __future__ import annotations

import sqlalchemy as sa

from controlroom.db.tables import site_calls
from controlroom.site.store import STATE_COLUMNS, tracked_operations
from controlroom.telemetry.ordering import Channel, SiteCallStatus
from controlroom.telemetry.widths import CHANNEL_WIDTH, STATUS_WIDTH


def _width(column: sa.Column[object]) -> int | None:
    return getattr(column.type, "length", None)


def test_state_columns_have_central_widths() -> None:
    site = {name: _width(tracked_operations.c[name]) for name in STATE_COLUMNS}
    central = {name: _width(site_calls.c[name]) for name in STATE_COLUMNS}
    assert site == central


def test_every_status_and_channel_fits_its_column() -> None:
    assert max(len(status.value) for status in SiteCallStatus) <= STATUS_WIDTH
    assert max(len(channel.value) for channel in Channel) <= CHANNEL_WIDTH
