"""The site's notification shape (``telemetry.notification``) agrees with central's
outbox: the same channels and severities, and what the site takes central stores."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from controlroom.notifications.lifecycle import Channel, Severity
from controlroom.notifications.store import NewNotification, check
from controlroom.telemetry.notification import (
    NOTIFICATION_CHANNELS,
    NOTIFICATION_SEVERITIES,
    SiteNotification,
    forwarded_item,
)
from controlroom.telemetry.widths import NOTIFICATION_BODY_WIDTH

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def test_the_site_knows_centrals_channels_and_severities() -> None:
    assert set(NOTIFICATION_CHANNELS) == set(Channel)
    assert set(NOTIFICATION_SEVERITIES) == set(Severity)
    fields = SiteNotification.model_fields
    assert set(fields["channel"].annotation.__args__) == set(Channel)  # type: ignore[union-attr]
    assert set(fields["severity"].annotation.__args__) == set(Severity)  # type: ignore[union-attr]


@pytest.mark.parametrize("channel", list(Channel))
def test_the_longest_notification_the_site_takes_is_one_central_stores(channel: str) -> None:
    taken = SiteNotification(
        target="t" * 256, subject="s" * 256, body="b" * NOTIFICATION_BODY_WIDTH, channel=channel
    )
    item = forwarded_item(taken, notification_id="1b4e28ba-2fa1-11d2-883f-0016d3cca427",
                          source_site="p" * 64)  # fmt: skip
    check(
        NewNotification(
            source=f"site:{item['source_site']}",
            channel=item["channel"],
            target=item["target"],
            subject=item["subject"],
            body=item["body"],
            severity=item["severity"],
            notification_id=item["notification_id"],
        )
    )


@pytest.mark.parametrize(
    ("field", "length"),
    [("target", 257), ("subject", 257), ("body", NOTIFICATION_BODY_WIDTH + 1)],
)
def test_one_character_more_is_refused_naming_the_field(field: str, length: int) -> None:
    values = {"target": "oncall", "subject": "Pump", field: "x" * length}
    with pytest.raises(ValidationError) as refused:
        SiteNotification.model_validate(values)
    assert [e["loc"] for e in refused.value.errors()] == [(field,)]
