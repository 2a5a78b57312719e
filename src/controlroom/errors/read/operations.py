"""Operator actions on failed messages: archive, unarchive, resolve pending retries.

Each action is one set-based ``UPDATE ... WHERE id IN (...)`` (or a subquery on a group,
or a time range) run on the caller's ``Connection``, inside the caller's transaction
(``db.engine.begin_write``); it sets ``status``, ``status_changed_at`` and
``last_modified`` of exactly the rows it changes. No read-modify-write per row.

Transitions (ServiceControl's, narrowed so an action never overrides another one's
outcome):

- archive: Unresolved -> Archived;
- unarchive: Archived -> Unresolved;
- resolve (the pending-retries routes): RetryIssued or Unresolved -> Resolved (a message
  never retried is resolved too, as ServiceControl resolves it), and a retry claim
  (``failed_message_retries``) is removed, as the writer does for a confirmed retry.

A message in any other status is left as it is and reported as unchanged.

By-id actions check the ids first: when any id names no failed message, nothing is
changed and the unknown ids are returned, so a bad request loses nothing and hides
nothing (docs/design.md "Conventions").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from controlroom.db.providers import provider_for
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_groups,
    failed_message_retries,
    failed_messages,
)
from controlroom.errors.read.filters import failed_in_queue

fm = failed_messages.c

MAX_IDS_PER_REQUEST = 10_000
"""Most ids one by-id action takes: one ``IN`` list stays within every provider's bound
parameter limit (``Provider.max_bound_parameters``), so the action is one statement."""

UNRESOLVED = int(FailedMessageStatus.UNRESOLVED)
RESOLVED = int(FailedMessageStatus.RESOLVED)
RETRY_ISSUED = int(FailedMessageStatus.RETRY_ISSUED)
ARCHIVED = int(FailedMessageStatus.ARCHIVED)
RESOLVABLE = (UNRESOLVED, RETRY_ISSUED)

IdAction = Callable[[sa.Connection, Iterable[str], datetime], "StatusChange"]
"""``(conn, ids, now) -> StatusChange``: the by-id actions below."""

GroupAction = Callable[[sa.Connection, str, datetime], int]
"""``(conn, group_id, now) -> messages changed``: ``archive_group``, ``unarchive_group``."""


@dataclass(frozen=True, slots=True)
class StatusChange:
    """The outcome of a by-id action; every list sorted, ids in lower-case "D" form.

    ``unknown`` non-empty means the action was refused and nothing changed.
    """

    changed: list[str]  # now in the action's target status, changed by this call
    unchanged: list[str]  # exist, but were not in the status the action applies to
    unknown: list[str]  # no failed message has this id

    @property
    def refused(self) -> bool:
        return bool(self.unknown)


# --- by id --------------------------------------------------------------------------------
def archive_messages(conn: sa.Connection, ids: Iterable[str], now: datetime) -> StatusChange:
    """Archive the Unresolved messages among ``ids``; see ``StatusChange``.

    Raises ``ValueError`` for more than ``MAX_IDS_PER_REQUEST`` distinct ids.
    """
    return _change_by_id(conn, ids, from_status=UNRESOLVED, to_status=ARCHIVED, now=now)


def unarchive_messages(conn: sa.Connection, ids: Iterable[str], now: datetime) -> StatusChange:
    """Make the Archived messages among ``ids`` Unresolved again; see ``StatusChange``.

    Raises ``ValueError`` for more than ``MAX_IDS_PER_REQUEST`` distinct ids.
    """
    return _change_by_id(conn, ids, from_status=ARCHIVED, to_status=UNRESOLVED, now=now)


def resolve_pending_retries(conn: sa.Connection, ids: Iterable[str], now: datetime) -> StatusChange:
    """Mark the RetryIssued and Unresolved messages among ``ids`` Resolved and drop their
    retry claims.

    For an operator who knows a message succeeded although no confirmation came back (or
    needs no retry). Raises ``ValueError`` for more than ``MAX_IDS_PER_REQUEST`` ids.
    """
    return _change_by_id(
        conn, ids, from_status=RESOLVABLE, to_status=RESOLVED, now=now, drop_claims=True
    )


# --- by group or time range ---------------------------------------------------------------
def archive_group(conn: sa.Connection, group_id: str, now: datetime) -> int:
    """Archive every Unresolved message of ``group_id``; returns how many were archived."""
    return _count(conn, _update(_in_group(group_id), UNRESOLVED, ARCHIVED, now))


def unarchive_group(conn: sa.Connection, group_id: str, now: datetime) -> int:
    """Make every Archived message of ``group_id`` Unresolved; returns how many changed."""
    return _count(conn, _update(_in_group(group_id), ARCHIVED, UNRESOLVED, now))


def resolve_pending_retries_between(
    conn: sa.Connection,
    start: datetime,
    end: datetime,
    now: datetime,
    *,
    queue_address: str | None = None,
) -> int:
    """Resolve every RetryIssued or Unresolved message whose ``last_modified`` is within
    ``start`` .. ``end`` (both inclusive, UTC), and that failed in ``queue_address`` when
    given, dropping their retry claims; returns how many.

    ServiceControl's ``MarkPendingRetriesAsResolved`` selects by the same range and queue.
    """
    selected: sa.ColumnElement[bool] = fm.last_modified.between(start, end)
    if queue_address is not None:
        selected = sa.and_(selected, failed_in_queue(queue_address))
    _drop_retry_claims(conn, selected)
    return _count(conn, _update(selected, RESOLVABLE, RESOLVED, now))


def unarchive_between(conn: sa.Connection, start: datetime, end: datetime, now: datetime) -> int:
    """Make every Archived message whose ``last_modified`` is within ``start`` .. ``end``
    (both inclusive, UTC) Unresolved; returns how many. Source: ServiceControl's
    ``PATCH errors/{from}...{to}/unarchive``."""
    return _count(conn, _update(fm.last_modified.between(start, end), ARCHIVED, UNRESOLVED, now))


# --- helpers ------------------------------------------------------------------------------
def _change_by_id(
    conn: sa.Connection,
    ids: Iterable[str],
    *,
    from_status: int | tuple[int, ...],
    to_status: int,
    now: datetime,
    drop_claims: bool = False,
) -> StatusChange:
    wanted = _distinct(ids)
    if not wanted:
        return StatusChange(changed=[], unchanged=[], unknown=[])
    unknown = _unknown_ids(conn, wanted)
    if unknown:
        return StatusChange(changed=[], unchanged=[], unknown=unknown)
    selected = fm.id.in_(wanted)
    if drop_claims:
        _drop_retry_claims(conn, selected)
    statement = _update(selected, from_status, to_status, now)
    updated = provider_for(conn).update_returning(conn, statement, [fm.id])
    changed = sorted(row.id for row in updated)
    done = set(changed)
    return StatusChange(
        changed=changed, unchanged=[item for item in wanted if item not in done], unknown=[]
    )


def _distinct(ids: Iterable[str]) -> list[str]:
    wanted = sorted(set(ids))
    if len(wanted) > MAX_IDS_PER_REQUEST:
        raise ValueError(f"at most {MAX_IDS_PER_REQUEST} ids per request, got {len(wanted)}")
    return wanted


def _unknown_ids(conn: sa.Connection, wanted: list[str]) -> list[str]:
    """The ids that name no row. Locks the rows that exist in id order (FOR UPDATE, where
    the provider has row locks) so that two overlapping by-id actions wait for each other
    instead of deadlocking on rows updated in different orders."""
    locked = sa.select(fm.id).where(fm.id.in_(wanted)).order_by(fm.id).with_for_update()
    known = set(conn.execute(locked).scalars())
    return [item for item in wanted if item not in known]


def _update(
    where: sa.ColumnElement[bool],
    from_status: int | tuple[int, ...],
    to_status: int,
    now: datetime,
) -> sa.Update:
    """The one statement of an action: rows matching ``where`` and in ``from_status`` (one
    status or several) move to ``to_status``, stamped ``now``."""
    statuses = from_status if isinstance(from_status, tuple) else (from_status,)
    return (
        sa.update(failed_messages)
        .where(where, fm.status.in_(statuses))
        .values(status=to_status, status_changed_at=now, last_modified=now)
    )


def _count(conn: sa.Connection, statement: sa.Update) -> int:
    """Run ``statement``; the number of rows it changed (every provider reports it)."""
    return conn.execute(statement).rowcount


def _in_group(group_id: str) -> sa.ColumnElement[bool]:
    members = sa.select(failed_message_groups.c.failed_message_id).where(
        failed_message_groups.c.group_id == group_id
    )
    return fm.id.in_(members)


def _drop_retry_claims(conn: sa.Connection, selected: sa.ColumnElement[bool]) -> None:
    """Delete the retry claims of the RetryIssued messages matching ``selected``; run
    before the status update, while those messages are still RetryIssued."""
    pending = sa.select(fm.id).where(selected, fm.status == RETRY_ISSUED)
    conn.execute(
        sa.delete(failed_message_retries).where(
            failed_message_retries.c.failed_message_id.in_(pending)
        )
    )
