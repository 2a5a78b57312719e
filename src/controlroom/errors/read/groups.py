"""Failure groups, read at query time: aggregates of ``failed_message_groups``, plus each
group's comment.

A group exists while at least one failed message belongs to it (a row of
``failed_message_groups``). Its view counts only the messages in one status: Unresolved
for the recoverability views, Archived for the archive views. ``first`` is the earliest
first failure and ``last`` the latest last failure of the counted messages, as
ServiceControl's ``FailureGroupsViewIndex`` computes them. The database keeps what the
views need: the group rows carry their message's status and failure window (copies,
migration 0011), and ``failed_message_group_counts`` counts them per group and status
(migration 0014). A view reads the counts and, per group, its first and last failure by
two index probes: its cost follows the number of groups, not of messages. SQLAlchemy
Core only; every function takes an open ``Connection``; times are timezone-aware UTC.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa

from controlroom.db.providers import provider_for
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_group_comments,
    failed_message_group_counts,
    failed_message_group_hours,
    failed_message_groups,
    failed_messages,
    retry_operations,
)
from controlroom.errors.ingest import identity
from controlroom.errors.ingest.grouping import CLASSIFIERS, EXCEPTION_TYPE_AND_STACK_TRACE
from controlroom.runtime.clock import utc_now

fm = failed_messages.c
fmg = failed_message_groups.c
counts = failed_message_group_counts.c
comments = failed_message_group_comments.c
hours = failed_message_group_hours.c
ro = retry_operations.c

FAILURE_GROUP_RETRY = "FailureGroup"
"""``retry_operations.retry_type`` of a retry of a whole group (ServiceControl's name)."""

CLASSIFIER_NAMES: tuple[str, ...] = tuple(classifier.name for classifier in CLASSIFIERS)
"""The classifiers' names, default first (ServiceControl lists them in this order)."""

DEFAULT_CLASSIFIER = EXCEPTION_TYPE_AND_STACK_TRACE

HOURS_SHOWN = 24
"""The hours of failures a group view shows (``GroupSummary.failures_per_hour``)."""

GroupSort = Literal["last", "growth"]
"""How ``list_groups`` orders: latest ``last`` first (ServiceControl's order), or
largest ``growth`` first (ties by latest ``last``)."""


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """One failure group as the groups view shows it, counting messages of one status."""

    id: str  # identity.group_id(classifier, title)
    title: str
    classifier: str
    count: int  # messages of the counted status in the group
    first: datetime | None  # earliest first failure of those messages; None when count is 0
    last: datetime | None  # latest last failure of those messages; None when count is 0
    comment: str | None
    failures_per_hour: tuple[int, ...] = ()
    """Failures of the group in each of the last ``HOURS_SHOWN`` hours (UTC, whole hours),
    oldest first, the current hour last; every status (a failure stays counted when its
    message is retried or archived). From ``failed_message_group_hours`` (migration 0022)."""

    @property
    def growth(self) -> int:
        """``growth(self.failures_per_hour)``."""
        return growth(self.failures_per_hour)


def growth(failures_per_hour: Sequence[int]) -> int:
    """Failures in the newer half of ``failures_per_hour`` minus those in the older half:
    above 0 the group fails more now than half a day before."""
    half = len(failures_per_hour) // 2
    return sum(failures_per_hour[half:]) - sum(failures_per_hour[:half])


def list_groups(
    conn: sa.Connection,
    classifier: str,
    *,
    status: FailedMessageStatus = FailedMessageStatus.UNRESOLVED,
    title: str | None = None,
    sort: GroupSort = "last",
    descending: bool = True,
    now: datetime | None = None,
) -> list[GroupSummary]:
    """The groups of ``classifier`` that hold messages in ``status``, latest ``last``
    first (ties by id), or by ``sort``; not ``descending``, the other way round (smallest
    growth first, ties still by latest ``last``); each with its failures per hour up to ``now``
    (default: the clock's). ``title`` keeps only the group with that exact title
    (ServiceControl's ``classifierFilter``). An unknown classifier has no groups."""
    # The id is a hash of classifier and title: the index finds it, the title may not.
    group_id = None if title is None else identity.group_id(classifier, title)
    rows = conn.execute(_with_comments(_aggregates(classifier, status, group_id), classifier))
    found = with_failures_per_hour(conn, [_group(row) for row in rows], now or utc_now())
    if sort == "growth":
        # Stable: equal growth keeps the order by latest last failure.
        sign = -1 if descending else 1
        return sorted(found, key=lambda group: sign * group.growth)
    return found if descending else found[::-1]


def with_failures_per_hour(
    conn: sa.Connection, found: Sequence[GroupSummary], now: datetime
) -> list[GroupSummary]:
    """``found`` with each group's ``failures_per_hour`` up to ``now``'s hour
    (``failures_per_hour``)."""
    counted = failures_per_hour(conn, [group.id for group in found], now)
    return [replace(group, failures_per_hour=counted[group.id]) for group in found]


def failures_per_hour(
    conn: sa.Connection, group_ids: Sequence[str], now: datetime
) -> dict[str, tuple[int, ...]]:
    """Per group id, its failures in each of the ``HOURS_SHOWN`` hours up to ``now``'s,
    oldest first, whatever their messages' status now: one read of
    ``failed_message_group_hours`` for those hours, at most a row per group and hour
    (PostgreSQL: also the rows appended since the last fold,
    ``Provider.compact_group_counts``), whatever the number of messages."""
    current = int(now.timestamp()) // 3600
    first = current - HOURS_SHOWN + 1
    counted: dict[str, list[int]] = {group_id: [0] * HOURS_SHOWN for group_id in group_ids}
    if not counted:
        return {}
    statement = (
        sa.select(hours.group_id, hours.hour, sa.cast(sa.func.sum(hours.n), sa.BigInteger))
        .where(hours.hour.between(first, current))
        .group_by(hours.group_id, hours.hour)
    )
    if len(counted) == 1:  # one group (by id): its own index range
        statement = statement.where(hours.group_id == next(iter(counted)))
    for group_id, hour, n in conn.execute(statement):
        if group_id in counted:
            counted[group_id][hour - first] = int(n)
    return {group_id: tuple(counts) for group_id, counts in counted.items()}


def get_group(
    conn: sa.Connection,
    group_id: str,
    *,
    status: FailedMessageStatus = FailedMessageStatus.UNRESOLVED,
) -> GroupSummary | None:
    """The group ``group_id`` counting its messages in ``status``; ``None`` when no failed
    message belongs to the group at all. A group whose messages are all in other statuses
    has ``count`` 0 and no ``first``/``last``."""
    found = conn.execute(
        sa.select(fmg.classifier, fmg.title).where(fmg.group_id == group_id).limit(1)
    ).one_or_none()
    if found is None:
        return None
    aggregates = _aggregates(found.classifier, status, group_id)
    row = conn.execute(_with_comments(aggregates, found.classifier)).one_or_none()
    if row is not None:
        (group,) = with_failures_per_hour(conn, [_group(row)], utc_now())
        return group
    empty = GroupSummary(
        id=group_id,
        title=found.title,
        classifier=found.classifier,
        count=0,
        first=None,
        last=None,
        comment=get_comment(conn, group_id),
    )
    (group,) = with_failures_per_hour(conn, [empty], utc_now())
    return group


def group_exists(conn: sa.Connection, group_id: str) -> bool:
    """True when at least one failed message belongs to ``group_id``."""
    found = conn.execute(
        sa.select(fmg.group_id).where(fmg.group_id == group_id).limit(1)
    ).one_or_none()
    return found is not None


# --- comments -----------------------------------------------------------------------------
def get_comment(conn: sa.Connection, group_id: str) -> str | None:
    """The comment on ``group_id``, ``None`` when there is none."""
    return conn.execute(
        sa.select(comments.comment).where(comments.group_id == group_id)
    ).scalar_one_or_none()


def set_comment(conn: sa.Connection, group_id: str, comment: str, now: datetime) -> None:
    """Make ``comment`` the comment on ``group_id`` (replacing any), stamped ``now``.

    Insert-if-absent then update: two writers racing the first comment both succeed and
    the later update wins, on every provider, without a provider-specific upsert.
    """
    provider_for(conn).insert_rows_if_absent(
        conn,
        failed_message_group_comments,
        [{"group_id": group_id, "comment": comment, "updated_at": now}],
    )
    conn.execute(
        sa.update(failed_message_group_comments)
        .where(comments.group_id == group_id)
        .values(comment=comment, updated_at=now)
    )


def delete_comment(conn: sa.Connection, group_id: str) -> bool:
    """Remove the comment on ``group_id``; False when there was none."""
    result = conn.execute(
        sa.delete(failed_message_group_comments).where(comments.group_id == group_id)
    )
    return result.rowcount > 0


# --- group retries ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GroupRetry:
    """A retry of a whole group (a ``retry_operations`` row of type ``FailureGroup``) as
    the group views show it. Counts are messages; times UTC."""

    group_id: str
    operation_id: str
    title: str | None  # the group's title when the retry was requested
    classifier: str | None
    message_count: int  # claimed so far (final once prepared)
    forwarded_count: int
    skipped_count: int
    failed: bool  # a message could not be sent
    started_at: datetime
    prepared_at: datetime | None
    completed_at: datetime | None


def group_retries(conn: sa.Connection) -> dict[str, GroupRetry]:
    """Per group id, the group retry its views show: the running one, else the latest
    completed one the operator has not acknowledged. Acknowledged ones are history.

    Reads only running and unacknowledged operations: few, whatever the store's size.
    """
    rows = conn.execute(
        sa.select(
            ro.id,
            ro.target,
            ro.originator,
            ro.classifier,
            ro.message_count,
            ro.forwarded_count,
            ro.skipped_count,
            ro.failed,
            ro.started_at,
            ro.prepared_at,
            ro.completed_at,
        )
        .where(
            ro.retry_type == FAILURE_GROUP_RETRY,
            ro.target.is_not(None),
            sa.or_(ro.completed_at.is_(None), ro.acknowledged.is_(False)),
        )
        .order_by(ro.started_at, ro.id)
    ).all()
    shown: dict[str, GroupRetry] = {}
    for row in rows:  # oldest first: a later operation replaces an earlier one...
        retry = GroupRetry(
            group_id=row.target,
            operation_id=row.id,
            title=row.originator,
            classifier=row.classifier,
            message_count=row.message_count,
            forwarded_count=row.forwarded_count,
            skipped_count=row.skipped_count,
            failed=row.failed,
            started_at=row.started_at,
            prepared_at=row.prepared_at,
            completed_at=row.completed_at,
        )
        earlier = shown.get(retry.group_id)
        # ...except that a running one is never hidden by a completed one.
        if earlier is None or earlier.completed_at is not None or retry.completed_at is None:
            shown[retry.group_id] = retry
    return shown


def acknowledge_group_retry(conn: sa.Connection, group_id: str) -> bool:
    """Mark the completed retries of ``group_id`` acknowledged (the operator dismissed
    them); False when none was waiting for it."""
    result = conn.execute(
        sa.update(retry_operations)
        .where(
            ro.retry_type == FAILURE_GROUP_RETRY,
            ro.target == group_id,
            ro.completed_at.is_not(None),
            ro.acknowledged.is_(False),
        )
        .values(acknowledged=True)
    )
    return result.rowcount > 0


# --- helpers ------------------------------------------------------------------------------
def _aggregates(
    classifier: str, status: FailedMessageStatus, group_id: str | None = None
) -> sa.Subquery:
    """Per group id of ``classifier`` (only ``group_id`` when given) with messages in
    ``status``: their count (the sum of the group's counts), earliest first failure and
    latest last failure (each an index probe into the group rows' copies)."""
    total = sa.cast(sa.func.sum(counts.n), sa.BigInteger)  # PostgreSQL: numeric otherwise
    counted = (
        sa.select(counts.group_id.label("id"), total.label("message_count"))
        .where(counts.classifier == classifier, counts.status == int(status))
        .group_by(counts.group_id)
        .having(total > 0)
    )
    if group_id is not None:
        counted = counted.where(counts.group_id == group_id)
    groups = counted.subquery("counted")
    first = sa.select(sa.func.min(fmg.first_failure_at)).where(
        fmg.group_id == groups.c.id, fmg.status == int(status)
    )
    last = sa.select(sa.func.max(fmg.last_failure_at)).where(
        fmg.classifier == classifier, fmg.status == int(status), fmg.group_id == groups.c.id
    )
    return sa.select(
        groups.c.id,
        groups.c.message_count,
        first.scalar_subquery().label("first"),
        last.scalar_subquery().label("last"),
    ).subquery("aggregates")


def _with_comments(aggregates: sa.Subquery, classifier: str) -> sa.Select[Any]:
    # A group's title is the same on all its rows (the id is a hash of it): one row's.
    titles = failed_message_groups.alias("titles")
    title = (
        sa.select(titles.c.title)
        .where(titles.c.group_id == aggregates.c.id)
        .limit(1)
        .scalar_subquery()
    )
    return (
        sa.select(
            aggregates,
            title.label("title"),
            sa.literal(classifier).label("classifier"),
            comments.comment,
        )
        .select_from(
            aggregates.outerjoin(
                failed_message_group_comments, comments.group_id == aggregates.c.id
            )
        )
        .order_by(aggregates.c["last"].desc(), aggregates.c.id)
    )


def _group(row: sa.Row[*tuple[Any, ...]]) -> GroupSummary:
    return GroupSummary(
        id=row.id,
        title=row.title,
        classifier=row.classifier,
        count=row.message_count,
        first=row.first,
        last=row.last,
        comment=row.comment,
    )
