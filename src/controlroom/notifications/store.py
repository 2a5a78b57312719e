"""The ``notifications`` table: enqueue, the dispatcher's claims and outcomes, operator
actions (docs/design.md "Notification outbox").

- ``enqueue`` writes a notification in the caller's transaction (a transactional outbox:
  the event and its notification commit together), idempotent on ``notification_id``
  and on ``(source, source_event_id)``: a rule's notification of one event takes an id
  derived from both, so a replayed event finds its row. A value longer than its column,
  or an unknown channel or severity, is refused (``NotificationRejected``), never
  truncated.
- ``claim_due`` takes due rows in one short transaction (``Provider.lock_for_claim``:
  ``FOR UPDATE SKIP LOCKED`` where several processes claim), marking each with a claim
  token and pushing its next attempt ``claim_for`` ahead: a dispatcher that dies
  mid-send leaves the row due again then (at least once, same id). A row the claiming
  process cannot send (``SendableTargets``) is left ``UNKNOWN_TARGET_GRACE`` past its due
  time to a process that can.
- ``record_attempt`` writes an attempt's outcome with one conditional update on the
  claim; a row that vanished (purged) or was claimed again is logged and never
  written back.
- ``keep_rejected``: a notification refused by ``check`` is kept whole, as received or
  rendered, with the reason, beside rejected telemetry (docs/design.md "Rejected
  notifications").
- ``act_on_parked``: an operator's Retry or Discard, one conditional update on
  ``status = 'Parked'`` and, only when it applied, one audit event and one event log
  item in the same transaction.
"""

from __future__ import annotations

import enum
import json
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from controlroom.db.providers import provider_for
from controlroom.db.tables import REJECTED_NOTIFICATION_SOURCE, notifications, rejected_telemetry
from controlroom.db.transactions import begin_write
from controlroom.event_types import EventType
from controlroom.events import Category, record_event
from controlroom.events import Severity as EventSeverity
from controlroom.exceptions import ControlroomError
from controlroom.notifications.lifecycle import (
    DUE,
    Attempt,
    Channel,
    Next,
    Severity,
    Status,
    error_text,
)
from controlroom.runtime.wire_text import is_wire_text_clean, storable_text
from controlroom.telemetry.contract import packet_bytes, rejection_id
from controlroom.telemetry.notification import check_recipients
from controlroom.telemetry.widths import (
    NOTIFICATION_BODY_WIDTH,
    NOTIFICATION_SOURCE_WIDTH,
    SITE_WIDTH,
    SOURCE_EVENT_ID_WIDTH,
    SUBJECT_WIDTH,
    TARGET_WIDTH,
)

log = logging.getLogger(__name__)
nc = notifications.c

RULE_NAMESPACE = uuid.UUID("6f0d5a52-2a43-4c55-9d0e-8f1d0c6a9b31")
"""Namespace of the ids derived from ``(source, source_event_id)`` (UUID version 5)."""

AUDIT_CATEGORY = "Notifications"

REJECTED_SOURCE_WIDTH: int = rejected_telemetry.c.source.type.length  # type: ignore[attr-defined]
"""Characters of ``rejected_telemetry.source``."""


class NotificationRejected(ControlroomError):
    """A notification cannot be stored whole: ``field`` names the value at fault,
    ``reason`` says why (an operator-facing sentence)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class NewNotification:
    """A notification to enqueue. ``source`` is ``site:<id>`` or ``rule:<name>``;
    ``target`` a recipient list's name (Email) or a webhook's name (Webhook), or, when a
    site named explicit ``recipients`` (Email), their label (``recipients_label``). A
    site gives its own ``notification_id`` (a GUID); a rule gives ``source_event_id``."""

    source: str
    channel: str
    target: str
    subject: str
    body: str
    severity: str = Severity.INFO
    notification_id: str | None = None
    source_event_id: str | None = None
    recipients: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The notification's id, and whether this call stored it (``False``: it was there)."""

    notification_id: str
    created: bool


_TEXT_FIELDS = (
    "notification_id",
    "source",
    "channel",
    "target",
    "subject",
    "body",
    "severity",
    "source_event_id",
)


def check(notification: NewNotification) -> None:
    """Refuse ``notification`` if it cannot be stored whole. Raises
    ``NotificationRejected`` naming the first field at fault."""
    widths = {
        "source": (notification.source, NOTIFICATION_SOURCE_WIDTH),
        "target": (notification.target, TARGET_WIDTH),
        "subject": (notification.subject, SUBJECT_WIDTH),
        "body": (notification.body, NOTIFICATION_BODY_WIDTH),
        "source_event_id": (notification.source_event_id, SOURCE_EVENT_ID_WIDTH),
    }
    if notification.recipients is not None:  # first: the target is their label
        if notification.channel != Channel.EMAIL:
            raise NotificationRejected("recipients", "addresses are mailed: channel must be Email")
        try:
            check_recipients(notification.recipients)
        except ValueError as exc:
            raise NotificationRejected("recipients", str(exc)) from None
    for field in _TEXT_FIELDS:
        value = getattr(notification, field)
        if value is not None and not is_wire_text_clean(value):
            raise NotificationRejected(field, "holds a lone surrogate, which is not text")
        if value is not None and "\x00" in value:
            raise NotificationRejected(field, "holds a NUL character, which no store keeps as text")
    for field, (value, width) in widths.items():
        if value is not None and len(value) > width:
            raise NotificationRejected(field, f"{len(value)} characters; at most {width}")
    kind, _, name = notification.source.partition(":")
    if kind not in ("site", "rule") or not name:
        raise NotificationRejected("source", "must be site:<id> or rule:<name>")
    if kind == "site" and len(name) > SITE_WIDTH:
        raise NotificationRejected("source", f"a site id has at most {SITE_WIDTH} characters")
    if not notification.target:
        raise NotificationRejected("target", "must not be empty")
    if not notification.subject:
        raise NotificationRejected("subject", "must not be empty")
    if notification.channel not in set(Channel):
        raise NotificationRejected("channel", f"must be one of {', '.join(Channel)}")
    if notification.severity not in set(Severity):
        raise NotificationRejected("severity", f"must be one of {', '.join(Severity)}")
    if notification.notification_id is not None:
        if notification.source_event_id is not None:
            raise NotificationRejected(
                "notification_id", "give a notification_id or a source_event_id, not both"
            )
        if not _is_guid(notification.notification_id):
            raise NotificationRejected("notification_id", "must be a GUID, lower-case D form")


def keep_rejected(
    conn: sa.Connection,
    source: str,
    notification: Any,
    reason: str,
    *,
    now: datetime,
    sent: bytes | None = None,
) -> str:
    """Keep ``notification`` (a site's item as received, or a rule's rendering: any JSON
    value) whole in ``rejected_telemetry`` with ``reason``, in ``conn``'s transaction,
    under the source ``notification:<source>`` (``source`` ``site:<id>`` or
    ``rule:<name>``; only its kind, ``site`` or ``rule``, when that is longer than the
    column: the value itself keeps it whole); the same value twice is kept once, apart from
    the same bytes refused as telemetry (``rejection_id``'s kinds). ``sent``:
    its bytes as a site sent them, kept instead of its JSON encoding when given.
    Returns its id."""
    packet = packet_bytes(notification) if sent is None else sent
    key = rejection_id(packet, kind=REJECTED_NOTIFICATION_SOURCE)
    label = REJECTED_NOTIFICATION_SOURCE + source
    if len(label) > REJECTED_SOURCE_WIDTH:
        label = REJECTED_NOTIFICATION_SOURCE + source.partition(":")[0]
    provider_for(conn.engine).insert_rows_if_absent(
        conn,
        rejected_telemetry,
        [
            {
                "id": key,
                "source": label,
                "packet": packet,
                "reason": reason,
                "rejected_at_utc": now,
            }
        ],
    )
    return key


def rejected_source(site: Any) -> str:
    """The source a site's rejected notification is kept under: ``site:<id>``, or
    ``site`` when the item names no usable site id (none, too long, or text no store
    keeps: a NUL or a lone surrogate; the kept item still holds it, as sent)."""
    if isinstance(site, str) and site and len(site) <= SITE_WIDTH and storable_text(site) == site:
        return f"site:{site}"
    return "site"


def _is_guid(text: str) -> bool:
    """Whether ``text`` is a GUID in its lower-case D form (an empty text is not)."""
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


def notification_id_of(notification: NewNotification) -> str:
    """The id ``notification`` is stored under: its own, one derived from its source and
    source event, or a new one."""
    if notification.notification_id is not None:
        return notification.notification_id
    if notification.source_event_id is not None:
        name = f"{notification.source}\n{notification.source_event_id}"
        return str(uuid.uuid5(RULE_NAMESPACE, name))
    return str(uuid.uuid4())


def webhook_payload(notification_id: str, notification: NewNotification, now: datetime) -> str:
    """The JSON a webhook receives, serialised once: the same bytes on every attempt."""
    return _serialised(
        {
            "type": "notification",
            "notification_id": notification_id,
            "source": notification.source,
            "severity": notification.severity,
            "subject": notification.subject,
            "body": notification.body,
            "created_at_utc": now.isoformat(),
        }
    )


def payload_with_text(payload: str, subject: str, body: str) -> str:
    """``payload`` (``webhook_payload``'s) saying ``subject`` and ``body`` instead."""
    return _serialised({**json.loads(payload), "subject": subject, "body": body})


def _serialised(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def enqueue(
    conn: sa.Connection,
    notification: NewNotification,
    *,
    now: datetime,
    due_at: datetime | None = None,
    event_count: int | None = None,
    failure_groups: str | None = None,
) -> Enqueued:
    """Store ``notification`` as Pending, due ``due_at`` (default ``now``), in ``conn``'s
    transaction (module docstring); ``event_count`` is how many events a rule coalesced
    into it, ``failure_groups`` the failure groups it counts (``rules``, JSON). Raises
    ``NotificationRejected``; nothing is written then."""
    check(notification)
    notification_id = notification_id_of(notification)
    row = {
        "notification_id": notification_id,
        "source": notification.source,
        "channel": notification.channel,
        "target": notification.target,
        "subject": notification.subject,
        "body": notification.body,
        "severity": notification.severity,
        "status": Status.PENDING.value,
        "retry_count": 0,
        "created_at_utc": now,
        "updated_at_utc": now,
        "next_attempt_at_utc": due_at or now,
        "source_event_id": notification.source_event_id,
        "event_count": event_count,
        "failure_groups": failure_groups,
        "recipients": None
        if notification.recipients is None
        else json.dumps(list(notification.recipients)),
        "payload": webhook_payload(notification_id, notification, now)
        if notification.channel == Channel.WEBHOOK
        else None,
    }
    statement = provider_for(conn.engine).insert_if_absent(
        notifications, key=[nc.notification_id], returning=(nc.notification_id,)
    )
    inserted = conn.execute(statement, row).first()
    return Enqueued(notification_id, created=inserted is not None)


@dataclass(frozen=True, slots=True)
class Claimed:
    """A notification a dispatcher holds to send: what the send needs, and its claim."""

    notification_id: str
    source: str
    channel: str
    target: str
    subject: str
    body: str
    severity: str
    retry_count: int
    payload: str | None
    delivered_to: tuple[str, ...]
    claim_token: str
    recipients: tuple[str, ...] | None = None
    failure_groups: str | None = None
    """A rule's notification of failure groups: its window and groups (``rules``, JSON)."""


UNKNOWN_TARGET_GRACE = timedelta(minutes=5)
"""How long past its due time a notification waits for a process that can send it (one
whose settings name its webhook or recipient list, with an SMTP server for e-mail) before
one that cannot claims it, to fail it as an unknown target or park it for want of an
SMTP server (docs/design.md "Notification channels"). Several serves of one database may
run with different settings while a change of them rolls out."""


@dataclass(frozen=True, slots=True)
class SendableTargets:
    """What a process's settings let it send: its webhooks' names, its recipient lists'
    names, and whether it has an SMTP server (e-mail to a site's own addresses needs only
    that)."""

    webhooks: frozenset[str]
    recipient_lists: frozenset[str]
    smtp: bool

    def condition(self) -> sa.ColumnElement[bool]:
        """The notifications this process can send, as a SQL condition."""
        email = sa.and_(
            nc.channel == Channel.EMAIL.value,
            sa.or_(nc.recipients.is_not(None), nc.target.in_(sorted(self.recipient_lists))),
        )
        return sa.or_(
            sa.and_(nc.channel == Channel.WEBHOOK.value, nc.target.in_(sorted(self.webhooks))),
            *([email] if self.smtp else []),
        )


def claim_due(
    engine: sa.Engine,
    *,
    now: datetime,
    limit: int,
    claim_for: timedelta,
    sendable: SendableTargets,
) -> list[Claimed]:
    """Claim at most ``limit`` notifications due at ``now``, oldest due first: those
    ``sendable`` names, and any other once ``UNKNOWN_TARGET_GRACE`` past due (module
    docstring)."""
    provider = provider_for(engine)
    due = (
        sa.select(nc.notification_id)
        .where(
            nc.status.in_([status.value for status in DUE]),
            sa.or_(
                sa.and_(nc.next_attempt_at_utc <= now, sendable.condition()),
                nc.next_attempt_at_utc <= now - UNKNOWN_TARGET_GRACE,
            ),
        )
        .order_by(nc.next_attempt_at_utc)
        .limit(limit)
    )
    token = str(uuid.uuid4())
    with begin_write(engine) as conn:
        keys = list(conn.execute(provider.lock_for_claim(due)).scalars())
        if not keys:
            return []
        conn.execute(
            sa.update(notifications)
            .where(provider.is_one_of(nc.notification_id, keys))
            .values(claim_token=token, next_attempt_at_utc=now + claim_for)
        )
        rows = conn.execute(sa.select(notifications).where(nc.claim_token == token)).all()
    return [
        Claimed(
            notification_id=row.notification_id,
            source=row.source,
            channel=row.channel,
            target=row.target,
            subject=row.subject,
            body=row.body,
            severity=row.severity,
            retry_count=row.retry_count,
            payload=row.payload,
            delivered_to=tuple(json.loads(row.delivered_to)) if row.delivered_to else (),
            claim_token=token,
            recipients=tuple(json.loads(row.recipients)) if row.recipients else None,
            failure_groups=row.failure_groups,
        )
        for row in rows
    ]


def record_attempt(
    engine: sa.Engine, claimed: Claimed, attempt: Attempt, after: Next, *, now: datetime
) -> bool:
    """Write the outcome of sending ``claimed``: ``after`` (``lifecycle.after_attempt``)
    and ``attempt``'s error, reply code and recipients. Returns ``False``, writing
    nothing, when the row is gone or no longer holds this claim (a warning is logged)."""
    values: dict[str, Any] = {
        "status": after.status.value,
        "retry_count": after.retry_count,
        "next_attempt_at_utc": after.next_attempt_at,
        "terminal_at_utc": after.terminal_at,
        "updated_at_utc": now,
        "reply_code": attempt.reply_code,
        "claim_token": None,
    }
    if attempt.error is not None:
        values["last_error"] = error_text(attempt.error)
    if attempt.delivered_to is not None:
        values["delivered_to"] = json.dumps(list(attempt.delivered_to))
    with begin_write(engine) as conn:
        written = conn.execute(
            sa.update(notifications)
            .where(
                nc.notification_id == claimed.notification_id,
                nc.claim_token == claimed.claim_token,
            )
            .values(values)
        ).rowcount
    if written != 1:
        log.warning(
            "notification %s: its row is gone or claimed again; the outcome of its attempt "
            "(%s) is not written",
            claimed.notification_id,
            attempt.verdict,
        )
        return False
    return True


class Command(enum.StrEnum):
    """An operator's action on a Parked notification."""

    RETRY = "Retry"
    DISCARD = "Discard"


class ActionOutcome(enum.StrEnum):
    """What an operator's action did: applied, refused (not Parked), or nothing there."""

    APPLIED = "Applied"
    NOT_PARKED = "NotParked"
    NOT_FOUND = "NotFound"


@dataclass(frozen=True, slots=True)
class ActionResult:
    """The outcome, and the notification's status after it (``None`` when not found)."""

    outcome: ActionOutcome
    status: str | None


_AUDIT_ACTION = {
    Command.RETRY: EventType.NOTIFICATION_RETRIED,
    Command.DISCARD: EventType.NOTIFICATION_DISCARDED,
}


def act_on_parked(
    engine: sa.Engine, notification_id: str, command: Command, operator: str, *, now: datetime
) -> ActionResult:
    """Apply an operator's Retry (Parked -> Pending, due now, attempts counted afresh) or
    Discard (Parked -> Discarded) of ``notification_id`` (module docstring). Exactly one
    audit event (actor ``operator``) is written when it applied, none otherwise."""
    if command is Command.RETRY:
        values: dict[str, Any] = {
            "status": Status.PENDING.value,
            "retry_count": 0,
            "next_attempt_at_utc": now,
            "claim_token": None,
        }
    else:
        values = {"status": Status.DISCARDED.value, "terminal_at_utc": now}
    with begin_write(engine) as conn:
        applied = conn.execute(
            sa.update(notifications)
            .where(nc.notification_id == notification_id, nc.status == Status.PARKED.value)
            .values(updated_at_utc=now, **values)
        ).rowcount
        if applied == 1:
            _audit(conn, notification_id, command, operator, now)
            return ActionResult(ActionOutcome.APPLIED, values["status"])
        status = conn.execute(
            sa.select(nc.status).where(nc.notification_id == notification_id)
        ).scalar_one_or_none()
    if status is None:
        return ActionResult(ActionOutcome.NOT_FOUND, None)
    return ActionResult(ActionOutcome.NOT_PARKED, status)


def _audit(
    conn: sa.Connection, notification_id: str, command: Command, operator: str, now: datetime
) -> None:
    row = conn.execute(
        sa.select(nc.source, nc.channel, nc.target).where(nc.notification_id == notification_id)
    ).one()
    action = _AUDIT_ACTION[command]
    event = {
        "event_id": str(uuid.uuid4()),
        "occurred_at_utc": now,
        "occurred_at_tick": 0,  # central's own clock reads microseconds
        "ingested_at_utc": now,
        "actor": operator,
        "action": action,
        "outcome": "Success",
        "category": AUDIT_CATEGORY,
        "target": row.target,
        "source_site": row.source.removeprefix("site:") if row.source.startswith("site:") else None,
        "source_node": None,
        "correlation_id": notification_id,
        "details_json": json.dumps(
            {"command": command.value, "channel": row.channel, "source": row.source},
            sort_keys=True,
        ),
        "payload_truncated": False,
    }
    provider_for(conn.engine).insert_audit_events(conn, [event])
    record_event(
        conn,
        description=f"{operator}: {command.value} of notification {notification_id}",
        severity=EventSeverity.INFO,
        category=Category.NOTIFICATIONS,
        event_type=action,
        raised_at=now,
        related_to=[f"/notification/{notification_id}"],
    )
