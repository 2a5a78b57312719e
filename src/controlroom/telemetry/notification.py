"""What a site's notification is, as the site agent takes it and central stores it.

Source: docs/design.md "Notification outbox" (rows, reject never truncate). A site's
script sends a notification to a ``target`` (the name of a recipient list for ``Email``,
of a webhook for ``Webhook``, as central's settings name them), or by ``Email`` to
explicit ``recipients`` (at most ``MAX_RECIPIENTS`` plain addresses, none twice: an
address goes into a header, so one holding a line break, a space or a second address is
refused), with a ``subject`` and a ``body`` and a ``severity``. A notification to
recipients is stored with ``recipients_label`` as its target (what lists and filters
show); central mails the addresses, only in the domains it allows the site
(docs/decisions.md "Explicit recipients of a site's notification"). The agent holds it
to the widths of central's ``notifications`` columns before storing it, so what central
would refuse for its size is refused at the site, naming the field, and never cut.
Pure: no I/O.

``forwarded_item`` is the JSON object central's intake ``POST /api/site-notifications``
takes for one notification, and ``ForwardedNotification`` the contract both sides hold it
to: what the agent would refuse, central refuses too, naming the same fields.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

from controlroom.telemetry.contract import Guid, SiteName, storable
from controlroom.telemetry.widths import NOTIFICATION_BODY_WIDTH, SUBJECT_WIDTH, TARGET_WIDTH

NOTIFICATION_CHANNELS: Final = ("Email", "Webhook")
"""How central delivers a notification (its ``notifications.channel``)."""
NOTIFICATION_SEVERITIES: Final = ("Info", "Warning", "Error", "Critical")
"""How much a notification matters (its ``notifications.severity``)."""

MAX_RECIPIENTS: Final = 50
"""Explicit addresses one notification may name."""
ADDRESS_WIDTH: Final = 254
"""Characters of one address (RFC 5321's longest path less its angle brackets)."""
ADDRESS: Final = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*")
"""One plain ASCII address, local@domain (an international domain in its ``xn--``
form): no white space or control character (so no CR or LF), no second address, no
display name, quote or comment. ``check_recipients`` also refuses ``=?``, an
encoded word's start (RFC 2047 5: never in an address)."""


def check_recipients(addresses: Sequence[str]) -> None:
    """Refuse ``addresses`` unless they are 1 to ``MAX_RECIPIENTS`` distinct plain
    addresses of at most ``ADDRESS_WIDTH`` characters, none holding an encoded word.
    Raises ``ValueError`` saying which and why."""
    if not addresses:
        raise ValueError("name at least one address")
    if len(addresses) > MAX_RECIPIENTS:
        raise ValueError(f"{len(addresses)} addresses; at most {MAX_RECIPIENTS}")
    for address in addresses:
        if len(address) > ADDRESS_WIDTH:
            raise ValueError(f"an address of {len(address)} characters; at most {ADDRESS_WIDTH}")
        if not ADDRESS.fullmatch(address):
            raise ValueError(f"{address!r} is not one plain address, local@domain")
        if "=?" in address:
            # The e-mail package decodes an encoded word even in an address, so the To
            # header would name whatever it encodes (docs/decisions.md "Explicit
            # recipients of a site's notification").
            raise ValueError(f"{address!r} holds an encoded word (=?), never in an address")
    if len(set(addresses)) != len(addresses):
        raise ValueError("an address is named twice")


def recipients_label(addresses: Sequence[str]) -> str:
    """The target a notification to ``addresses`` is stored and listed under: the
    addresses, comma-separated, when that fits ``TARGET_WIDTH``; else the first and how
    many more; else how many (the addresses themselves are kept whole beside it). No
    addresses: an empty label (``check_recipients`` refuses them)."""
    if not addresses:
        return ""
    for label in (", ".join(addresses), f"{addresses[0]} and {len(addresses) - 1} more"):
        if len(label) <= TARGET_WIDTH:
            return label
    return f"{len(addresses)} addresses"


def domain_of(address: str) -> str:
    """The domain of a plain ``address``, lower-case (domains compare without case)."""
    return address.rpartition("@")[2].lower()


def _recipients(addresses: list[str]) -> list[str]:
    check_recipients(addresses)
    return addresses


NotificationTarget = Annotated[
    str, Field(min_length=1, max_length=TARGET_WIDTH), AfterValidator(storable)
]
Subject = Annotated[str, Field(min_length=1, max_length=SUBJECT_WIDTH), AfterValidator(storable)]
Body = Annotated[str, Field(max_length=NOTIFICATION_BODY_WIDTH), AfterValidator(storable)]
Recipients = Annotated[list[str], AfterValidator(_recipients)]


def _mailed(recipients: list[str] | None, info: ValidationInfo) -> list[str] | None:
    """Recipients only by e-mail (named under ``recipients``: ``channel`` comes before)."""
    if recipients is not None and info.data.get("channel", "Email") != "Email":
        raise ValueError("addresses are mailed: channel must be Email")
    return recipients


def _destination(target: str | None, recipients: list[str] | None) -> str:
    if recipients is not None:
        return recipients_label(recipients)
    assert target is not None  # each model's validator refuses neither
    return target


class SiteNotification(BaseModel):
    """One notification a site sends, to a ``target`` or (Email) to ``recipients``
    (``check_recipients``). ``target`` and ``subject`` at most 256 characters,
    ``body`` at most ``NOTIFICATION_BODY_WIDTH`` (``telemetry.widths``); no value may
    hold a NUL or an unpaired surrogate. Raises ``pydantic.ValidationError`` naming each
    field at fault."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: NotificationTarget | None = Field(
        None,
        description="A recipient list's name (Email) or a webhook's name (Webhook); "
        "none when recipients names the addresses.",
    )
    subject: Subject
    body: Body = ""
    channel: Literal["Email", "Webhook"] = "Email"
    severity: Literal["Info", "Warning", "Error", "Critical"] = "Info"
    notification_id: Guid | None = Field(
        None, description="A GUID the caller chose (made at the site when absent)."
    )
    recipients: Recipients | None = Field(
        None,
        validate_default=True,
        description="Email only: the addresses to mail, instead of a target.",
    )

    @field_validator("recipients")
    @classmethod
    def _one_destination(cls, recipients: list[str] | None, info: ValidationInfo) -> Any:
        """A target or recipients, not both; recipients only by e-mail (named under
        ``recipients``: the fields before it are known here)."""
        if "target" not in info.data or "channel" not in info.data:
            return recipients  # refused already, naming its own field
        if recipients is None:
            if info.data["target"] is None:
                raise ValueError("name a target or recipients")
            return recipients
        if info.data["target"] is not None:
            raise ValueError("name a target or recipients, not both")
        return _mailed(recipients, info)

    @property
    def destination(self) -> str:
        """The target it is stored under: ``target``, or the label of its recipients."""
        return _destination(self.target, self.recipients)


class ForwardedNotification(BaseModel):
    """One site's notification as its agent forwards it (``forwarded_item``) and
    central's intake takes it: a ``SiteNotification``'s fields with the site's id and
    the notification's GUID (read in any case, kept lower-case). With ``recipients``,
    ``target`` is their label as the agent computed it: central takes the label from the
    addresses itself (``destination``), never the one sent. Raises
    ``pydantic.ValidationError`` naming each field at fault."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    notification_id: Guid
    source_site: SiteName
    channel: Literal["Email", "Webhook"]
    target: NotificationTarget | None = None
    subject: Subject
    body: Body
    severity: Literal["Info", "Warning", "Error", "Critical"] = "Info"
    recipients: Recipients | None = Field(None, validate_default=True)

    @field_validator("recipients")
    @classmethod
    def _a_destination(cls, recipients: list[str] | None, info: ValidationInfo) -> Any:
        if recipients is None and "target" in info.data and info.data["target"] is None:
            raise ValueError("name a target or recipients")
        return _mailed(recipients, info)

    @property
    def destination(self) -> str:
        """The target it is stored under: ``target``, or the label of its recipients."""
        return _destination(self.target, self.recipients)


def forwarded_item(
    notification: SiteNotification, *, notification_id: str, source_site: str
) -> dict[str, Any]:
    """The object central's intake takes for ``notification`` of ``source_site``."""
    forwarded = ForwardedNotification(
        notification_id=notification_id,
        source_site=source_site,
        channel=notification.channel,
        target=notification.destination,
        recipients=notification.recipients,
        subject=notification.subject,
        body=notification.body,
        severity=notification.severity,
    )
    return forwarded.model_dump()
