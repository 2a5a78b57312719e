"""What a site's notification is, as the site agent takes it and central stores it.

Source: docs/design.md "Notification outbox" (rows, reject never truncate). A site's
script sends a notification to a ``target`` (the name of a recipient list for ``Email``,
of a webhook for ``Webhook``, as central's settings name them) with a ``subject`` and a
``body`` and a ``severity``. The agent holds it to the widths of central's
``notifications`` columns before storing it, so what central would refuse for its size
is refused at the site, naming the field, and never cut. Pure: no I/O.

``forwarded_item`` is the JSON object central's intake ``POST /api/site-notifications``
takes for one notification.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from controlroom.telemetry.contract import Guid, StorableText, storable
from controlroom.telemetry.widths import NOTIFICATION_BODY_WIDTH, SUBJECT_WIDTH, TARGET_WIDTH

NOTIFICATION_CHANNELS: Final = ("Email", "Webhook")
"""How central delivers a notification (its ``notifications.channel``)."""
NOTIFICATION_SEVERITIES: Final = ("Info", "Warning", "Error", "Critical")
"""How much a notification matters (its ``notifications.severity``)."""

NotificationTarget = Annotated[
    str, Field(min_length=1, max_length=TARGET_WIDTH), AfterValidator(storable)
]
Subject = Annotated[str, Field(min_length=1, max_length=SUBJECT_WIDTH), AfterValidator(storable)]


class SiteNotification(BaseModel):
    """One notification a site sends. ``target`` and ``subject`` at most 256 characters,
    ``body`` at most ``NOTIFICATION_BODY_WIDTH`` (``telemetry.widths``); no value may
    hold a NUL or an unpaired surrogate. Raises ``pydantic.ValidationError`` naming each
    field at fault."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: NotificationTarget = Field(
        description="A recipient list's name (Email) or a webhook's name (Webhook)."
    )
    subject: Subject
    body: Annotated[StorableText, Field(max_length=NOTIFICATION_BODY_WIDTH)] = ""
    channel: Literal["Email", "Webhook"] = "Email"
    severity: Literal["Info", "Warning", "Error", "Critical"] = "Info"
    notification_id: Guid | None = Field(
        None, description="A GUID the caller chose (made at the site when absent)."
    )


def forwarded_item(
    notification: SiteNotification, *, notification_id: str, source_site: str
) -> dict[str, Any]:
    """The object central's intake takes for ``notification`` of ``source_site``."""
    return {
        "notification_id": notification_id,
        "source_site": source_site,
        "channel": notification.channel,
        "target": notification.target,
        "subject": notification.subject,
        "body": notification.body,
        "severity": notification.severity,
    }
