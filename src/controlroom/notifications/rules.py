"""Notification rules: event log items become notifications in the transaction that
records them (a transactional outbox: no event without its notification, no
notification without its event), coalesced per window (docs/design.md "Notification
rules").

A rule (``notifications.rules[]``) matches an event by its type and, optionally, its
``related_to`` paths (one path, an endpoint, a failure group, a site) and a least
severity. The events of one rule in one window — the rule's ``window``-long slots
counted from the Unix epoch — make one notification, id derived from the rule and the
window's start (``source_event_id`` ``window:<start>``). The first event enqueues it due
at the window's end; each later one counts itself into it (subject, body and webhook
payload say how many) while it has not been claimed. An event that comes when its
window's notification is already claimed or done goes to the next window's (and so on):
it is never in the event log only. A storm of 10,000 events is one notification saying
10,000. A rendering the store refuses is kept whole with the reason (``keep_rejected``)
and the event commits.

Events about a failure group's failures (``GROUP_FAILURE_EVENTS``) are raised once per
change, not per failure: a storm of 5,000 failures of one group is one
``FailureGroupAppeared`` and at most one ``GroupFailuresPassedThreshold``. Their
notification therefore also names the groups (``failure_groups``, at most
``COUNTED_GROUPS_LIMIT``), and says how many failed messages each had in the window,
read when the notification is first claimed, after its window ended
(``count_group_failures``), from the group rows along their ``(group_id,
last_failure_at)`` index: by their time of failure, as the groups views count; a group
that appeared in the window counts all its failed messages up to the window's end (a
backlog ingested late is new too). The error writer writes nothing more for it
(docs/decisions.md "A rule's notification counts its groups' failures when it is
sent").
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import sqlalchemy as sa

from controlroom.config import NotificationRule, NotificationSettings
from controlroom.db.tables import failed_message_groups, notifications
from controlroom.db.transactions import begin_write
from controlroom.events import (
    EventLogItem,
    at_least,
    endpoint_path,
    group_path,
    site_path,
    subscribe,
)
from controlroom.notifications.lifecycle import Status
from controlroom.notifications.store import (
    Claimed,
    NewNotification,
    NotificationRejected,
    enqueue,
    keep_rejected,
    payload_with_text,
    webhook_payload,
)
from controlroom.telemetry.widths import NOTIFICATION_BODY_WIDTH

log = logging.getLogger(__name__)
nc = notifications.c
gc = failed_message_groups.c

APPEARED = "FailureGroupAppeared"
GROUP_FAILURE_EVENTS = frozenset({APPEARED, "GroupFailuresPassedThreshold"})
"""Event types about a failure group's failures: their notification counts the group's
failed messages in its window (module docstring)."""

COUNTED_GROUPS_LIMIT = 50
"""Failure groups one notification counts at most; it says when there were more."""

TITLE_SHOWN = 200
"""Characters of a group's title a notification shows at most (an ellipsis marks a
longer one); the group's id follows it whole."""

_GROUP_PREFIX = group_path("")


@contextlib.contextmanager
def rules_applied(engine: sa.Engine, settings: NotificationSettings) -> Iterator[None]:
    """For the block: every event recorded on ``engine`` meets ``settings``' rules in its
    transaction (``apply_rules``). Every process that opens the store for work that
    writes events (serve, its workers, the CLI's commands) runs that work inside one, so
    no event escapes the rules."""
    unsubscribe = subscribe(engine, partial(apply_rules, settings))
    try:
        yield
    finally:
        unsubscribe()


def matches(rule: NotificationRule, event: EventLogItem) -> bool:
    """``event`` is one ``rule`` reacts to."""
    if event.event_type not in rule.event_types or not at_least(event.severity, rule.min_severity):
        return False
    paths = (
        rule.related_to,
        None if rule.endpoint is None else endpoint_path(rule.endpoint),
        None if rule.group is None else group_path(rule.group),
        None if rule.site is None else site_path(rule.site),
    )
    return all(path is None or path in event.related_to for path in paths)


def window_of(rule: NotificationRule, at: datetime) -> tuple[datetime, datetime]:
    """The start and end (UTC) of ``rule``'s window holding ``at``."""
    seconds = rule.window.total_seconds()
    start = math.floor(at.timestamp() / seconds) * seconds
    begins = datetime.fromtimestamp(start, UTC)
    return begins, begins + timedelta(seconds=seconds)


def notification_of(
    rule: NotificationRule, event: EventLogItem, count: int, start: datetime, end: datetime
) -> NewNotification:
    """The notification of ``count`` events of ``rule`` in the window ``start``-``end``,
    ``event`` the latest."""
    kinds = ", ".join(rule.event_types)
    noun = "event" if count == 1 else "events"
    return NewNotification(
        source=f"rule:{rule.name}",
        channel=rule.channel,
        target=rule.target,
        subject=f"{rule.name}: {count:,} {noun}",
        body=(
            f"{count:,} {noun} of rule {rule.name} ({kinds}) between {start.isoformat()} and "
            f"{end.isoformat()}.\nLatest ({event.event_type}, {event.raised_at.isoformat()}): "
            f"{event.description}"
        ),
        severity=rule.severity,
        source_event_id=f"window:{start.isoformat()}",
    )


def apply_rules(settings: NotificationSettings, conn: sa.Connection, event: EventLogItem) -> None:
    """Enqueue or count ``event`` into each matching rule's notification of its window,
    in ``conn``'s transaction (the event's)."""
    for rule in settings.rules:
        if matches(rule, event):
            _count(rule, conn, event)


def _count(rule: NotificationRule, conn: sa.Connection, event: EventLogItem) -> None:
    start, end = window_of(rule, event.raised_at)
    # A claimed window's notification was due, so its window has ended: the windows
    # after it are walked until one is not claimed yet (a future one never is).
    while not _count_into(rule, conn, event, start, end):
        start, end = end, end + rule.window


def failure_group_of(event: EventLogItem) -> str | None:
    """The id of the failure group whose failures ``event`` is about, if it is one of
    ``GROUP_FAILURE_EVENTS``."""
    if event.event_type not in GROUP_FAILURE_EVENTS:
        return None
    for path in event.related_to:
        if path.startswith(_GROUP_PREFIX):
            return path.removeprefix(_GROUP_PREFIX)
    return None


def with_group(
    stored: str | None, event: EventLogItem, start: datetime, end: datetime
) -> str | None:
    """``stored`` (a notification's ``failure_groups``, JSON, or ``None``) naming also
    the failure group of ``event``, if any: ``{"from", "to"}`` (the window, ISO 8601),
    ``"groups"`` (each id to ``{"new": appeared in the window, "failed": failed
    messages, null until counted}``) and ``"more"`` (groups past
    ``COUNTED_GROUPS_LIMIT`` came). Answers ``stored`` itself when nothing changes."""
    group = failure_group_of(event)
    if group is None:
        return stored
    state: dict[str, Any] = (
        {"from": start.isoformat(), "to": end.isoformat(), "groups": {}, "more": False}
        if stored is None
        else json.loads(stored)
    )
    groups: dict[str, dict[str, Any]] = state["groups"]
    new = event.event_type == APPEARED
    if group in groups:
        if not new or groups[group]["new"]:
            return stored
        groups[group]["new"] = True
    elif len(groups) >= COUNTED_GROUPS_LIMIT:
        if state["more"]:
            return stored
        state["more"] = True
    else:
        groups[group] = {"new": new, "failed": None}
    return json.dumps(state, sort_keys=True)


def _count_into(
    rule: NotificationRule,
    conn: sa.Connection,
    event: EventLogItem,
    start: datetime,
    end: datetime,
) -> bool:
    """Enqueue or count ``event`` into ``rule``'s notification of ``start``-``end``;
    ``False`` when that one is claimed or done already."""
    first = notification_of(rule, event, 1, start, end)
    try:
        stored = enqueue(
            conn,
            first,
            now=event.raised_at,
            due_at=end,
            event_count=1,
            failure_groups=with_group(None, event, start, end),
        )
    except NotificationRejected as exc:
        # Kept, never raised: a rule's fault must not undo the change the event records.
        keep_rejected(conn, first.source, asdict(first), str(exc), now=event.raised_at)
        return True
    if stored.created:
        return True
    unsent = sa.and_(
        nc.notification_id == stored.notification_id,
        nc.status == Status.PENDING.value,
        nc.retry_count == 0,
        nc.claim_token.is_(None),
    )
    # The count first: its row lock holds the row until the commit, so the text written
    # next says the count of this transaction, whatever other writers do.
    counted = conn.execute(
        sa.update(notifications).where(unsent).values(event_count=nc.event_count + 1)
    ).rowcount
    if counted != 1:
        return False
    count, groups = conn.execute(
        sa.select(nc.event_count, nc.failure_groups).where(
            nc.notification_id == stored.notification_id
        )
    ).one()
    latest = notification_of(rule, event, count, start, end)
    values: dict[str, Any] = {
        "subject": latest.subject,
        "body": latest.body,
        "payload": webhook_payload(stored.notification_id, latest, event.raised_at)
        if rule.channel == "Webhook"
        else None,
        "updated_at_utc": event.raised_at,
    }
    if (named := with_group(groups, event, start, end)) != groups:
        values["failure_groups"] = named
    conn.execute(
        sa.update(notifications).where(nc.notification_id == stored.notification_id).values(values)
    )
    return True


def count_group_failures(engine: sa.Engine, claimed: Claimed, *, now: datetime) -> Claimed:
    """``claimed`` saying how many failed messages each of its failure groups had in its
    window (module docstring), written to its row while the claim holds. Counted once,
    at the first claim: the text then stays as first sent, the same bytes on every
    attempt. A notification naming no group, or counted already, is answered as is."""
    if claimed.failure_groups is None:
        return claimed
    state: dict[str, Any] = json.loads(claimed.failure_groups)
    groups: dict[str, dict[str, Any]] = state["groups"]
    if all(group["failed"] is not None for group in groups.values()):
        return claimed
    start, end = datetime.fromisoformat(state["from"]), datetime.fromisoformat(state["to"])
    titles: dict[str, str] = {}
    with engine.connect() as conn:  # reads only: no write lock held while counting
        for group_id, group in groups.items():
            since = None if group["new"] else start
            group["failed"] = _failed_messages(conn, group_id, since, end)
            titles[group_id] = _title(conn, group_id)
    subject, body = _counted_text(claimed, state, titles)
    counted = replace(
        claimed,
        subject=subject,
        body=body,
        payload=None
        if claimed.payload is None
        else payload_with_text(claimed.payload, subject, body),
        failure_groups=json.dumps(state, sort_keys=True),
    )
    with begin_write(engine) as conn:
        written = conn.execute(
            sa.update(notifications)
            .where(
                nc.notification_id == claimed.notification_id,
                nc.claim_token == claimed.claim_token,
            )
            .values(
                subject=counted.subject,
                body=counted.body,
                payload=counted.payload,
                failure_groups=counted.failure_groups,
                updated_at_utc=now,
            )
        ).rowcount
    if written != 1:
        log.warning(
            "notification %s: its row is gone or claimed again; its failure counts are not written",
            claimed.notification_id,
        )
    return counted


def _failed_messages(
    conn: sa.Connection, group_id: str, since: datetime | None, until: datetime
) -> int:
    """The failed messages of ``group_id`` whose time of failure is in [``since``,
    ``until``) (no lower bound when ``since`` is ``None``): one range of
    ``ix_failed_message_groups_group_id_last_failure_at``."""
    where = [gc.group_id == group_id, gc.last_failure_at < until]
    if since is not None:
        where.append(gc.last_failure_at >= since)
    counted: int = conn.execute(
        sa.select(sa.func.count()).select_from(failed_message_groups).where(*where)
    ).scalar_one()
    return counted


def _title(conn: sa.Connection, group_id: str) -> str:
    """The title of ``group_id`` (its id when no row of it is left)."""
    title: str | None = conn.execute(
        sa.select(gc.title).where(gc.group_id == group_id).limit(1)
    ).scalar_one_or_none()
    if title is None:
        return group_id
    return title if len(title) <= TITLE_SHOWN else title[: TITLE_SHOWN - 1] + "\u2026"


def _counted_text(
    claimed: Claimed, state: dict[str, Any], titles: dict[str, str]
) -> tuple[str, str]:
    """The subject and body of ``claimed`` once its groups are counted: the largest
    count in the subject, every group's in the body, then the events' text."""
    groups: dict[str, dict[str, Any]] = state["groups"]
    ordered = sorted(groups, key=lambda group_id: (-groups[group_id]["failed"], group_id))
    largest = groups[ordered[0]]["failed"] if ordered else 0
    noun = "failed message" if largest == 1 else "failed messages"
    subject = f"{claimed.source.removeprefix('rule:')}: {largest:,} {noun}"
    if len(groups) > 1 or state["more"]:
        more = "+" if state["more"] else ""
        subject += f" in the largest of {len(groups):,}{more} failure groups"
    lines = [
        f"Failed messages of each failure group between {state['from']} and {state['to']}, "
        "by their time of failure (a group new in this window: all of its failed messages "
        "before its end), counted when first sent:"
    ]
    for group_id in ordered:
        new = ", new" if groups[group_id]["new"] else ""
        lines.append(
            f"- {groups[group_id]['failed']:,}: {titles[group_id]} (group {group_id}{new})"
        )
    if state["more"]:
        lines.append(f"- further groups, past the first {COUNTED_GROUPS_LIMIT:,}, not counted")
    counts = "\n".join(lines)
    body = f"{counts}\n\n{claimed.body}"
    # The events' text may be as long as a body may be: the counts come first.
    return subject, body if len(body) <= NOTIFICATION_BODY_WIDTH else counts
