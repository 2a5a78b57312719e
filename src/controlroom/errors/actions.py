"""An operator's actions on the error instance, each one function the API routers and the
console both call: the change and its event log item in one transaction.

Source: docs/decisions.md "The console calls the same functions as the API". ``by`` is
the name of the principal acting (the API's bearer token, the console's session; the
open API's ``anonymous``). Retries go through ``errors/retries/requests.py`` (each
``retry_*`` takes ``by`` and logs the request), edits through its ``edit_and_retry``,
re-imports through ``errors/ingest/reimport.reimport_failed_import``; a site call's
Retry/Discard through ``sitecalls/relay.relay_command`` (its audit event and event log
item). A later action (a notification's Retry/Discard) follows the same shape: one
function below ``api/`` and ``web/`` that changes, records and returns the outcome.

Each by-id and group action runs in ``run_write_transaction``: replayed whole on a
deadlock with a writer or another bulk action (PostgreSQL), event included.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from controlroom.db.engine import begin_write, run_write_transaction
from controlroom.errors import activity
from controlroom.errors.read import endpoints, groups, operations
from controlroom.errors.retries.requests import UnknownGroup
from controlroom.runtime.clock import Clock, utc_now


def archive_messages(
    engine: sa.Engine, ids: Sequence[str], *, by: str, clock: Clock = utc_now
) -> operations.StatusChange:
    """Archive the Unresolved messages among ``ids`` (``operations.archive_messages``)
    and log what changed (``FailedMessagesArchived``). Refused whole, nothing written,
    when an id names no message (``StatusChange.refused``)."""
    return _by_ids(engine, ids, operations.archive_messages, by=by, archived=True, clock=clock)


def unarchive_messages(
    engine: sa.Engine, ids: Sequence[str], *, by: str, clock: Clock = utc_now
) -> operations.StatusChange:
    """Make the Archived messages among ``ids`` Unresolved again and log it
    (``FailedMessagesUnArchived``); refused as ``archive_messages``."""
    return _by_ids(engine, ids, operations.unarchive_messages, by=by, archived=False, clock=clock)


def resolve_pending_retries(
    engine: sa.Engine, ids: Sequence[str], *, by: str, clock: Clock = utc_now
) -> operations.StatusChange:
    """Resolve the pending retries (and never-retried Unresolved messages) among ``ids``
    (``operations.resolve_pending_retries``); refused as ``archive_messages``. ``by`` is
    taken for the shape every action has; no event is logged, as ServiceControl logs
    none for it."""
    del by
    return run_write_transaction(
        engine, lambda conn: operations.resolve_pending_retries(conn, ids, clock())
    )


def archive_group(engine: sa.Engine, group_id: str, *, by: str, clock: Clock = utc_now) -> int:
    """Archive every Unresolved message of the group and log it; the messages changed.
    Raises ``UnknownGroup`` when no failed message belongs to ``group_id``."""
    return _group(engine, group_id, operations.archive_group, by=by, archived=True, clock=clock)


def unarchive_group(engine: sa.Engine, group_id: str, *, by: str, clock: Clock = utc_now) -> int:
    """Make every Archived message of the group Unresolved again and log it; raises as
    ``archive_group``."""
    return _group(engine, group_id, operations.unarchive_group, by=by, archived=False, clock=clock)


def acknowledge_group_retry(engine: sa.Engine, group_id: str) -> bool:
    """Dismiss the completed retries of ``group_id`` (ServiceControl's
    ``unacknowledgedgroups``); False when none awaited it. No event: ServiceControl logs
    none, and the retry's completion is logged already."""
    with begin_write(engine) as conn:
        return groups.acknowledge_group_retry(conn, group_id)


def set_endpoint_monitored(
    engine: sa.Engine, endpoint_id: str, monitored: bool, *, by: str, clock: Clock = utc_now
) -> bool:
    """Set an endpoint's ``monitored`` flag and log it (``MonitoringEnabledForEndpoint``
    or ``...Disabled...``); False, nothing logged, when there is no such endpoint."""
    with begin_write(engine) as conn:
        found = endpoints.set_monitored(conn, endpoint_id, monitored)
        if found:
            activity.endpoint_monitoring_changed(conn, endpoint_id, monitored, by=by, now=clock())
    return found


def _by_ids(
    engine: sa.Engine,
    ids: Sequence[str],
    action: operations.IdAction,
    *,
    by: str,
    archived: bool,
    clock: Clock,
) -> operations.StatusChange:
    def act(conn: sa.Connection) -> operations.StatusChange:
        now = clock()
        outcome = action(conn, ids, now)
        activity.messages_archived(conn, outcome.changed, by=by, now=now, archived=archived)
        return outcome

    return run_write_transaction(engine, act)


def _group(
    engine: sa.Engine,
    group_id: str,
    action: operations.GroupAction,
    *,
    by: str,
    archived: bool,
    clock: Clock,
) -> int:
    def act(conn: sa.Connection) -> int:
        if not groups.group_exists(conn, group_id):
            raise UnknownGroup(group_id)
        now = clock()
        changed = action(conn, group_id, now)
        activity.group_archived(conn, group_id, changed, by=by, now=now, archived=archived)
        return changed

    return run_write_transaction(engine, act)
