"""The site's notification shape (``telemetry.notification``) agrees with central's
outbox: the same channels and severities, and what the site takes central stores."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from controlroom.notifications.lifecycle import Channel, Severity
from controlroom.notifications.store import NewNotification, check
from controlroom.telemetry.notification import (
    ADDRESS_WIDTH,
    MAX_RECIPIENTS,
    NOTIFICATION_CHANNELS,
    NOTIFICATION_SEVERITIES,
    SiteNotification,
    forwarded_item,
    recipients_label,
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


def test_the_most_addresses_the_site_takes_are_ones_central_stores() -> None:
    addresses = [f"{n:02d}{'a' * 238}@plant.example" for n in range(MAX_RECIPIENTS)]
    assert all(len(address) == ADDRESS_WIDTH for address in addresses)
    taken = SiteNotification(subject="Pump", recipients=addresses)
    item = forwarded_item(taken, notification_id="1b4e28ba-2fa1-11d2-883f-0016d3cca427",
                          source_site="p" * 64)  # fmt: skip
    assert item["target"] == recipients_label(addresses) == "50 addresses"
    assert recipients_label(["a@b.example", "c@b.example"]) == "a@b.example, c@b.example"
    many = [f"user{n:02d}@plant.example" for n in range(20)]
    assert recipients_label(many) == "user00@plant.example and 19 more"
    check(
        NewNotification(
            source=f"site:{item['source_site']}",
            channel=item["channel"],
            target=item["target"],
            subject=item["subject"],
            body=item["body"],
            recipients=tuple(item["recipients"]),
            notification_id=item["notification_id"],
        )
    )
    with pytest.raises(ValidationError, match="recipients"):
        SiteNotification(subject="Pump", recipients=[*addresses, "one@more.example"])
