"""FailedMessageBatchWriter: a batch of the error queue written in one transaction.

Source: docs/design.md "Writer". Fold in memory, then in one transaction, in this order:
(1) conditional upsert of failed-message rows, (2) replace the group rows of messages
whose stored attempt is now this batch's, (3) insert-if-absent known endpoints (never
update one: ``monitored`` is the user's), (4) resolve confirmed retries, (5) commit.
Failed imports of the batch are kept in the same transaction, so one commit decides the
fate of every message the batch acknowledges. Before the commit, the batch's external
bodies are made sure of against the retention sweep's body collector
(``errors.retention``: no committed row ever points at a missing body).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import sqlalchemy as sa
import tenacity

from controlroom.db.engine import begin_write, retry_transient
from controlroom.db.providers import Provider, chunked, provider_for
from controlroom.db.tables import (
    GROUP_COPIES,
    GROUP_HOURS_KEPT,
    FailedMessageStatus,
    body_deletions,
    failed_error_imports,
    failed_message_group_hours,
    failed_message_groups,
    failed_message_retries,
    failed_messages,
    known_endpoints,
    retry_batches,
    retry_operations,
)
from controlroom.errors import activity, tallies
from controlroom.errors.ingest.bodies import BodyStore
from controlroom.errors.ingest.fold import FoldedMessage, fold_attempts, unique_endpoints
from controlroom.errors.ingest.grouping import CAUSE_CLASSIFIERS
from controlroom.errors.ingest.search_terms import message_search_terms
from controlroom.errors.ingest.upsert import (
    PAYLOAD_COLUMNS,
    counted_failure_times,
    upsert_failed_messages,
)
from controlroom.errors.model import FailedAttempt, FailedImport, FailureGroup, KnownEndpoint
from controlroom.runtime.clock import Clock, utc_now

log = logging.getLogger(__name__)


@dataclass
class IngestionBatch:
    """Everything one unit of work hands to the writer."""

    attempts: list[FailedAttempt] = field(default_factory=list)
    endpoints: list[KnownEndpoint] = field(default_factory=list)
    confirmed_retries: list[str] = field(default_factory=list)  # UniqueMessageIds
    failed_imports: list[FailedImport] = field(default_factory=list)

    def __len__(self) -> int:
        return (
            len(self.attempts)
            + len(self.endpoints)
            + len(self.confirmed_retries)
            + len(self.failed_imports)
        )


class FailedMessageBatchWriter:
    """Writes ``IngestionBatch`` es to the store; safe to use from several threads."""

    def __init__(
        self,
        engine: sa.Engine,
        *,
        retrying: tenacity.Retrying | None = None,
        clock: Clock = utc_now,
        body_store: BodyStore | None = None,
        alert_group_failures: int | None = None,
        alert_endpoint_failures: int | None = None,
    ) -> None:
        """``body_store``: where the batch's external bodies were put; without one the
        writer cannot guard them against the body collector (tests that never sweep).
        ``alert_group_failures``: ``ingestion.alert_group_failures_per_hour``;
        ``alert_endpoint_failures``: ``ingestion.alert_endpoint_failures_per_hour``."""
        self._engine = engine
        self._body_store = body_store
        self._alert_group_failures = alert_group_failures
        self._alert_endpoint_failures = alert_endpoint_failures
        # (endpoint, hour) whose threshold a committed batch of this writer saw reached:
        # not counted again (a storm's batches after the crossing cost nothing), so a
        # count that falls and crosses again within that hour goes unannounced by this
        # writer. Cleared when it grows.
        self._endpoint_hours_reached: set[tuple[str, int]] = set()
        self._reached_lock = threading.Lock()
        self._provider = provider_for(engine)
        self._retrying = retrying or retry_transient()
        self._clock = clock
        self._unfolded = 0  # messages written since this writer last folded tally deltas

    def write(self, batch: IngestionBatch) -> None:
        """Write ``batch`` in one transaction, retrying the whole batch on transient errors.

        Raises the store's exception when it is not transient (see
        ``controlroom.db.errors.classify_store_error``) or when retrying is stopped.
        """
        folded = fold_attempts(batch.attempts)
        # Computed once per batch, not per try: the terms are the costly part of a row.
        terms = [winner_search_terms(message) for message in folded]
        reached = self._retrying(self._write_once, batch, folded, terms)
        if reached:
            with self._reached_lock:
                if len(self._endpoint_hours_reached) > 10_000:
                    self._endpoint_hours_reached.clear()
                self._endpoint_hours_reached.update(reached)
        self._fold_tally_deltas(len(folded))

    def _fold_tally_deltas(self, written: int) -> None:
        """Fold the tally deltas (``errors.tallies``) after every
        ``FOLD_AFTER_MESSAGES`` messages this writer wrote, after its commit, so that a
        busy writer keeps them bounded without a reader. Unlocked: two threads may count
        the same messages, which only folds a little earlier. A failure is logged; the
        next fold takes what this one left."""
        self._unfolded += written
        if self._unfolded < tallies.FOLD_AFTER_MESSAGES:
            return
        self._unfolded = 0
        try:
            tallies.fold_deltas(self._engine)
        except sa.exc.DBAPIError:
            log.warning("folding the tally deltas failed; the next fold takes them", exc_info=True)

    def _write_once(
        self, batch: IngestionBatch, folded: list[FoldedMessage], terms: list[list[str]]
    ) -> list[tuple[str, int]]:
        """One try of ``write``; answers the (endpoint, hour) keys whose endpoint
        threshold it saw reached (``_raise_endpoint_crossings``)."""
        now = self._clock()
        with begin_write(self._engine) as conn:
            rows = [
                failed_message_row(message, now, search_terms)
                for message, search_terms in zip(folded, terms, strict=True)
            ]
            watched = self._endpoint_hours_before(conn, folded)
            stored = upsert_failed_messages(conn, self._provider, rows)
            self._release_claims_of_new_failures(conn, stored)
            self._replace_groups(conn, folded, stored, now)
            reached = self._raise_endpoint_crossings(conn, watched, len(folded), now)
            self._provider.insert_rows_if_absent(
                conn,
                known_endpoints,
                [known_endpoint_row(e, now) for e in unique_endpoints(batch.endpoints)],
            )
            self._resolve_confirmed_retries(conn, batch.confirmed_retries, now)
            imports = _unique_imports(batch.failed_imports)
            self._provider.insert_rows_if_absent(
                conn, failed_error_imports, [failed_import_row(item) for item in imports]
            )
            for item in imports:
                activity.failed_imports_kept(
                    conn, [(item.id, item.reason)], queue=item.queue, now=now
                )
            self._keep_external_bodies(conn, batch.attempts)
        return reached

    def _keep_external_bodies(self, conn: sa.Connection, attempts: Sequence[FailedAttempt]) -> None:
        """Cancel pending body deletions of the batch's messages, then write again any of
        the batch's external bodies the collector took before that (docs/decisions.md "No
        committed row points at a missing body").

        Deleting the ``body_deletions`` rows waits for a collector that holds one, so once
        it returns no collector can act on these messages until this transaction ends.
        Raises ``BodyStoreError`` when a body cannot be written (nothing commits).
        """
        if self._body_store is None:
            return
        external = {
            attempt.body_key: attempt
            for attempt in attempts
            if attempt.body_placement.external and attempt.body_key
        }
        if not external:
            return
        ids = sorted({attempt.unique_message_id for attempt in external.values()})
        for id_chunk in chunked(ids, self._provider.max_ids_per_in_list):
            conn.execute(
                sa.delete(body_deletions).where(body_deletions.c.failed_message_id.in_(id_chunk))
            )
        for key, attempt in external.items():
            if not self._body_store.exists(key):
                log.info("body %s was collected before its row committed; writing it again", key)
                self._body_store.put(key, attempt.body)

    def _release_claims_of_new_failures(
        self, conn: sa.Connection, stored: Sequence[sa.Row[*tuple[Any, ...]]]
    ) -> None:
        """A message this batch made Unresolved again (a new failure while RetryIssued)
        loses its retry claim with the new failure, so a new retry request takes it.
        Source: ServiceControl's retry cleaner; docs/decisions.md "A new failure releases
        the retry claim"."""
        if not stored:
            return
        # One statement of a fixed text whatever the number of ids (prepared once),
        # driven by the claims (almost always none of the batch's): a probe of their
        # primary key per id, each found claim's message read for its status.
        claims = failed_message_retries.c
        conn.execute(
            sa.delete(failed_message_retries).where(
                self._provider.is_one_of(claims.failed_message_id, sorted(r.id for r in stored)),
                sa.exists().where(
                    failed_messages.c.id == claims.failed_message_id,
                    failed_messages.c.status == int(FailedMessageStatus.UNRESOLVED),
                ),
            )
        )

    def _replace_groups(
        self,
        conn: sa.Connection,
        folded: Sequence[FoldedMessage],
        stored: Sequence[sa.Row[*tuple[Any, ...]]],
        now: datetime,
    ) -> None:
        """Step 2: messages whose stored attempt is now this batch's get its groups (a row
        the upsert skipped, bringing nothing new, is not in ``stored``), each group row
        with its copies of the message's columns (``group_rows_statement``). Only the
        messages the upsert updated have old group rows to delete: one it inserted has
        none, since group rows reference their message (docs/decisions.md "The upsert
        says which rows it inserted"). A group that had no row before is announced
        (``FailureGroupAppeared``, ``new_groups``)."""
        stored_attempt = {row.id: row.last_failure_at for row in stored}
        inserted = {row.id for row in stored if row.inserted}
        winners = [
            message
            for message in folded
            if stored_attempt.get(message.unique_message_id) == message.last_failure_at
        ]
        if not winners:
            return
        updated = [
            message.unique_message_id
            for message in winners
            if message.unique_message_id not in inserted
        ]
        # Two statements of a fixed text whatever the number of rows (prepared once).
        if updated:
            conn.execute(
                sa.delete(failed_message_groups).where(
                    self._provider.is_one_of(failed_message_groups.c.failed_message_id, updated)
                )
            )
        group_rows = [
            {
                "failed_message_id": message.unique_message_id,
                "group_id": group.id,
                "classifier": group.classifier,
                "title": group.title,
            }
            for message in winners
            for group in message.winner.groups
        ]
        if group_rows:
            fresh = self._new_groups(conn, winners)
            conn.execute(
                group_rows_statement(self._provider),
                self._provider.bound_rows_parameters(GROUP_ROW_KEYS, group_rows),
            )
            for group, endpoint, count in fresh:
                activity.failure_group_appeared(
                    conn, group.id, group.title, endpoint=endpoint, messages=count, now=now
                )
            if self._alert_group_failures is not None:
                self._raise_crossings(conn, winners, self._alert_group_failures, now)

    def _raise_crossings(
        self, conn: sa.Connection, winners: Sequence[FoldedMessage], threshold: int, now: datetime
    ) -> None:
        """``GroupFailuresPassedThreshold`` for each (group, hour) whose failures this
        batch brought from below ``threshold`` to it or past it: one grouped read of the
        hour counters the batch's inserts just wrote (``group_hours_reached``). Only the
        hours still counted (``GROUP_HOURS_KEPT`` before ``now``'s and later): an older
        hour's count is dropped by the providers, each at its own moment, so whether it
        crossed would depend on how the batches fell."""
        added: dict[tuple[str, int], int] = {}
        titles: dict[str, str] = {}
        kept_from = (now - _EPOCH) // timedelta(hours=1) - GROUP_HOURS_KEPT
        for message in winners:
            hour = _hour_of(message)
            if hour < kept_from:
                continue
            for group in message.winner.groups:
                added[group.id, hour] = added.get((group.id, hour), 0) + 1
                titles[group.id] = group.title
        for (group_id, hour), total in group_hours_reached(conn, self._provider, added):
            if total - added[group_id, hour] < threshold <= total:
                activity.group_failures_passed(
                    conn, group_id, titles[group_id], failures=total, hour=hour, now=now
                )

    def _endpoint_hours_before(
        self, conn: sa.Connection, folded: Sequence[FoldedMessage]
    ) -> dict[tuple[str, int], int]:
        """With ``alert_endpoint_failures`` set: each (receiving endpoint, hour) of the
        batch's failures, with its unresolved failures before the batch's upsert
        (``endpoint_hour_failures``, counted up to the threshold); empty otherwise."""
        threshold = self._alert_endpoint_failures
        if threshold is None:
            return {}
        with self._reached_lock:
            known = set(self._endpoint_hours_reached)
        keys = sorted(
            {(message.winner.receiving_endpoint, _hour_of(message)) for message in folded} - known
        )
        return {key: endpoint_hour_failures(conn, *key, limit=threshold) for key in keys}

    def _raise_endpoint_crossings(
        self,
        conn: sa.Connection,
        before: dict[tuple[str, int], int],
        messages: int,
        now: datetime,
    ) -> list[tuple[str, int]]:
        """``EndpointFailuresPassedThreshold`` for each (endpoint, hour) of ``before``
        whose unresolved failures the batch (of ``messages`` messages) brought from below
        the threshold to it or past it: counted again after the upsert, in the batch's
        transaction, up to what the batch could have added (so exactly). Answers the
        keys at or past the threshold (remembered only once the batch commits)."""
        threshold = self._alert_endpoint_failures
        if threshold is None:
            return []
        reached = []
        for (endpoint, hour), earlier in before.items():
            if earlier >= threshold:
                reached.append((endpoint, hour))
                continue
            total = endpoint_hour_failures(conn, endpoint, hour, limit=threshold + messages)
            if total >= threshold:
                reached.append((endpoint, hour))
                activity.endpoint_failures_passed(
                    conn, endpoint, failures=total, hour=hour, now=now
                )
        return reached

    def _new_groups(
        self, conn: sa.Connection, winners: Sequence[FoldedMessage]
    ) -> list[tuple[FailureGroup, str, int]]:
        """The batch's groups of a cause (``grouping.CAUSE_CLASSIFIERS``) with no row yet,
        each with the receiving endpoint of its first message and how many of the batch's
        messages it takes (``new_groups``). A new message type or endpoint instance is not
        a new failure: announcing every classifier's group would say one bug five times."""
        seen: dict[str, tuple[FailureGroup, str, int]] = {}
        for message in winners:
            for group in message.winner.groups:
                if group.classifier not in CAUSE_CLASSIFIERS:
                    continue
                first, endpoint, count = seen.get(
                    group.id, (group, message.winner.receiving_endpoint, 0)
                )
                seen[group.id] = (first, endpoint, count + 1)
        fresh = new_groups(conn, self._provider, sorted(seen))
        if fresh:
            # Another batch may be committing the same group's first rows: the first to
            # lock it announces it; the other waits for that commit, then sees its rows.
            self._provider.lock_group_appearances(conn, fresh)
            fresh = new_groups(conn, self._provider, fresh)
        return [seen[group_id] for group_id in fresh]

    def _resolve_confirmed_retries(
        self, conn: sa.Connection, unique_message_ids: Sequence[str], now: datetime
    ) -> None:
        """Step 4: confirmed retries become Resolved; their retry claims go away."""
        ids = sorted(set(unique_message_ids))
        for id_chunk in chunked(ids, self._provider.max_ids_per_in_list):
            conn.execute(
                sa.update(failed_messages)
                .where(failed_messages.c.id.in_(id_chunk))
                .where(failed_messages.c.status != int(FailedMessageStatus.RESOLVED))
                .values(
                    status=int(FailedMessageStatus.RESOLVED),
                    status_changed_at=now,
                    last_modified=now,
                )
            )
            removed = conn.execute(
                sa.delete(failed_message_retries)
                .where(failed_message_retries.c.failed_message_id.in_(id_chunk))
                .returning(*_CLAIM_STATE)
            ).all()
            _count_sent_unwritten(conn, removed)


_CLAIM_STATE = (
    failed_message_retries.c.retry_batch_id,
    failed_message_retries.c.in_flight_until,
    failed_message_retries.c.sent_at,
)
"""What a removed retry claim says of its send: its batch, whether a window took it, and
whether its send was written."""


def _count_sent_unwritten(
    conn: sa.Connection, removed: Sequence[sa.Row[*tuple[Any, ...]]]
) -> None:
    """Count as forwarded, in their operations, the removed claims that a window took and
    whose send no window wrote: their message came back confirmed before its window was
    written, or after the process that sent it ended (docs/decisions.md "A window in
    flight is claimed"). The claims were removed first, as a window locks them
    before it counts, so the two never wait on each other in opposite orders."""
    per_batch: dict[str, int] = {}
    for claim in removed:
        if claim.in_flight_until is not None and claim.sent_at is None:
            per_batch[claim.retry_batch_id] = per_batch.get(claim.retry_batch_id, 0) + 1
    for batch_id, count in sorted(per_batch.items()):
        operation = sa.select(retry_batches.c.request_id).where(retry_batches.c.id == batch_id)
        conn.execute(
            sa.update(retry_operations)
            .where(retry_operations.c.id == operation.scalar_subquery())
            .values(forwarded_count=retry_operations.c.forwarded_count + count)
        )


def _hour_of(message: FoldedMessage) -> int:
    """The clock hour of ``message``'s stored failure: whole hours since 1970 UTC, floored,
    as the databases count them (migrations 0022, 0037). In whole numbers: a float's
    ``timestamp()`` rounds the last microseconds of year 9999 into year 10000."""
    return (message.last_failure_at - _EPOCH) // timedelta(hours=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


_LAST_HOUR = datetime.max.replace(minute=0, second=0, microsecond=0, tzinfo=UTC)
"""The start of the calendar's last hour (9999-12-31 23:00 UTC)."""


def endpoint_hour_failures(
    conn: sa.Connection, endpoint: str, hour: int, *, limit: int | None
) -> int:
    """The unresolved failed messages of ``endpoint`` whose stored attempt failed in
    ``hour`` (whole hours since 1970 UTC), counted up to ``limit`` (all when ``None``):
    a range of ``ix_failed_messages_receiving_endpoint_last_failure_at``, each entry's row
    read for its status. Two PostgreSQL batches of one endpoint committing at once each
    count without the other's rows, so a crossing between them may go unannounced or be
    announced twice (docs/design.md "Notification rules")."""
    fm = failed_messages.c
    start = datetime.fromtimestamp(hour * 3600, UTC)
    in_hour = [fm.last_failure_at >= start]
    if start < _LAST_HOUR:  # the calendar's last hour has no end in it
        in_hour.append(fm.last_failure_at < start + timedelta(hours=1))
    rows = sa.select(sa.literal(1).label("one")).where(
        fm.receiving_endpoint == endpoint,
        *in_hour,
        fm.status == int(FailedMessageStatus.UNRESOLVED),
    )
    if limit is not None:
        rows = rows.limit(limit)
    counted: int = conn.execute(
        sa.select(sa.func.count()).select_from(rows.subquery())
    ).scalar_one()
    return counted


def group_hours_reached(
    conn: sa.Connection, provider: Provider, added: dict[tuple[str, int], int]
) -> list[tuple[tuple[str, int], int]]:
    """The failures counted now (this transaction's included) of each (group id, hour)
    of ``added``: one statement along ``ix_failed_message_group_hours_group_id_hour``.
    Two batches of one group committing at once on PostgreSQL may each count below the
    other's share, so a crossing between them goes unannounced (docs/design.md
    "Notification rules")."""
    hours = failed_message_group_hours.c
    group_ids = sorted({group_id for group_id, _ in added})
    rows = conn.execute(
        sa.select(hours.group_id, hours.hour, sa.func.sum(hours.n))
        .where(
            provider.is_one_of(hours.group_id, group_ids),
            hours.hour.in_(sorted({hour for _, hour in added})),
        )
        .group_by(hours.group_id, hours.hour)
    ).all()
    return [
        ((group_id, int(hour)), int(total))
        for group_id, hour, total in rows
        if (group_id, int(hour)) in added
    ]


def new_groups(conn: sa.Connection, provider: Provider, group_ids: Sequence[str]) -> list[str]:
    """Those of ``group_ids`` with no row in ``failed_message_groups``: one statement of
    a fixed text, an index probe per id (``ix_failed_message_groups_group_id_status_first``).
    Two batches committing a group's first rows at once may both find it new: the writer
    asks again under ``Provider.lock_group_appearances`` (docs/design.md "Notification
    rules")."""
    if not group_ids:
        return []
    # A correlated subquery per given id, which no planner turns into a join: at most one
    # index entry read per known group, however many rows it has (a DISTINCT over the
    # index read every row of every group).
    given = provider.bound_rows(failed_message_groups, _GROUP_ID)
    one_row = (
        sa.select(sa.literal(1))
        .where(failed_message_groups.c.group_id == given.c.group_id)
        .limit(1)
        .scalar_subquery()
    )
    known = set(
        conn.execute(
            sa.select(given.c.group_id).where(one_row.is_not(None)),
            provider.bound_rows_parameters(_GROUP_ID, [{"group_id": g} for g in group_ids]),
        ).scalars()
    )
    return [group_id for group_id in group_ids if group_id not in known]


_GROUP_ID = ("group_id",)


GROUP_ROW_KEYS = ("failed_message_id", "group_id", "classifier", "title")
"""What the writer knows of a group row; the copies (``GROUP_COPIES``) come from the
message."""


@cache
def group_rows_statement(provider: Provider) -> Any:
    """``INSERT INTO failed_message_groups ... SELECT`` of the rows bound as
    ``provider.bound_rows_parameters(GROUP_ROW_KEYS, rows)``, each joined to its message
    for the copies (``GROUP_COPIES``), built once per provider.

    The copies are read in the statement that inserts the rows, from the message as this
    transaction sees it: the writer holds the message's row lock since its upsert, so
    they are the values that commit, and any later change of the message in this
    transaction passes to the rows through the update trigger (migration 0011). So the
    insert trigger, which would look each row's message up again, is skipped for these
    rows (its ``WHEN``, migration 0013). A row whose message does not exist is not
    inserted (the writer only inserts rows of messages its upsert returned)."""
    given = provider.bound_rows(failed_message_groups, GROUP_ROW_KEYS)
    message = failed_messages.c
    rows = sa.select(*given.c, *(message[name] for name in GROUP_COPIES)).join_from(
        given, failed_messages, message.id == given.c.failed_message_id
    )
    return sa.insert(failed_message_groups).from_select([*GROUP_ROW_KEYS, *GROUP_COPIES], rows)


def winner_search_terms(message: FoldedMessage) -> list[str]:
    """The search terms of the attempt a folded message stores (its headers' values and
    body text; ``search_terms.message_search_terms``)."""
    winner = message.winner
    return message_search_terms(winner.headers, winner.body_placement.text)


def failed_message_row(
    message: FoldedMessage, now: datetime, search_terms: list[str] | None = None
) -> dict[str, Any]:
    """The row a folded message would be if it were new (the upsert guards do the rest);
    ``search_terms`` defaults to ``winner_search_terms(message)``."""
    winner = message.winner
    placement = winner.body_placement
    row: dict[str, Any] = {
        "id": message.unique_message_id,
        "status": int(FailedMessageStatus.UNRESOLVED),
        "status_changed_at": now,
        "last_modified": now,
        "number_of_processing_attempts": message.attempt_count,
        "counted_failure_times": counted_failure_times(message.failure_times),
        "first_failure_at": message.first_failure_at,
        "last_failure_at": message.last_failure_at,
        "body_size": placement.size,
        "body_text": placement.text,
        "body_stored_externally": placement.external,
        "search_vector": (
            search_terms if search_terms is not None else winner_search_terms(message)
        ),
    }
    for name in PAYLOAD_COLUMNS:
        if name not in row:
            row[name] = getattr(winner, name)
    return row


def known_endpoint_row(endpoint: KnownEndpoint, now: datetime) -> dict[str, Any]:
    return {
        "id": endpoint.id,
        "name": endpoint.name,
        "host_id": endpoint.host_id,
        "host": endpoint.host,
        "monitored": False,
        "first_seen_at": now,
    }


def failed_import_row(item: FailedImport) -> dict[str, Any]:
    return {
        "id": item.id,
        "queue": item.queue,
        "headers_json": item.headers_json,
        "body": item.body,
        "reason": item.reason,
        "failed_at": item.failed_at,
    }


def _unique_imports(items: Sequence[FailedImport]) -> list[FailedImport]:
    by_id = {item.id: item for item in items}
    return [by_id[key] for key in sorted(by_id)]
