"""The groups views equal the design's query-time aggregate at every committed state.

Since migration 0011 the group rows carry copies of their message's ``status``,
``first_failure_at`` and ``last_failure_at`` (since 0013 the writer's group-row insert
reads them from the messages; the database's triggers fill any other inserted row and
pass a message's changes on), and the groups views (``errors.read.groups``) read those
copies and the group counts the database keeps per group and status
(``failed_message_group_counts``, migration 0014; folded with the tallies,
``errors.tallies.fold_deltas``). Property: after any sequence of ingest (new attempts,
redeliveries, new groups), archive, unarchive (one message or a whole group), retry,
retry confirmation, resolve, retention sweep and folding of the counts, every copy equals
its message's columns, every count equals the number of group rows it counts, and every
view equals the aggregate of ``failed_message_groups`` joined to ``failed_messages``
(ServiceControl's ``FailureGroupsViewIndex``, as the views computed it before 0011). On
every provider, and on PostgreSQL under two concurrent writers.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlroom.db.engine import create_store_engine, retry_transient
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_group_counts,
    failed_message_groups,
    failed_messages,
)
from controlroom.db.transactions import begin_write
from controlroom.errors import tallies
from controlroom.errors.ingest import identity
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailureGroup
from controlroom.errors.read import groups, lists, operations
from controlroom.errors.read.counts import count_failed_messages
from controlroom.errors.read.filters import SORT_KEYS, FailedMessageFilter, Ordering
from controlroom.errors.read.lists import list_failed_messages
from controlroom.errors.retention import sweep_expired_failed_messages
from controlroom.errors.retries import requests
from tests.factories import at, attempt, message_uuid

fm = failed_messages.c
fmg = failed_message_groups.c
counts = failed_message_group_counts.c

MESSAGES = 6
CLASSIFIERS = ("Kind", "Place")
GROUPS = {
    classifier: [
        FailureGroup(
            id=identity.group_id(classifier, f"{classifier} {n}"),
            classifier=classifier,
            title=f"{classifier} {n}",
        )
        for n in range(3)
    ]
    for classifier in CLASSIFIERS
}
NOW = at(100_000)


def groups_of(choice: int) -> tuple[FailureGroup, ...]:
    """One group of each classifier, picked by ``choice``."""
    return (GROUPS["Kind"][choice % 3], GROUPS["Place"][(choice // 3) % 3])


# --- the operations -----------------------------------------------------------------------
def ingest(engine: sa.Engine, n: int, second: int, choice: int) -> None:
    writer = FailedMessageBatchWriter(engine, clock=lambda: NOW)
    writer.write(IngestionBatch(attempts=[attempt(n, at(second), groups=groups_of(choice))]))


def archive(engine: sa.Engine, n: int) -> None:
    with begin_write(engine) as conn:
        operations.archive_messages(conn, [message_uuid(n)], NOW)


def unarchive(engine: sa.Engine, n: int) -> None:
    with begin_write(engine) as conn:
        operations.unarchive_messages(conn, [message_uuid(n)], NOW)


def archive_group(engine: sa.Engine, choice: int) -> None:
    with begin_write(engine) as conn:
        operations.archive_group(conn, groups_of(choice)[0].id, NOW)


def unarchive_group(engine: sa.Engine, choice: int) -> None:
    with begin_write(engine) as conn:
        operations.unarchive_group(conn, groups_of(choice)[1].id, NOW)


def retry(engine: sa.Engine, n: int) -> None:
    # An unknown, archived or resolved message has nothing to retry.
    with contextlib.suppress(requests.RetryRequestError):
        requests.retry_message(engine, message_uuid(n), clock=lambda: NOW)


def confirm(engine: sa.Engine, n: int) -> None:
    writer = FailedMessageBatchWriter(engine, clock=lambda: NOW)
    writer.write(IngestionBatch(confirmed_retries=[message_uuid(n)]))


def resolve(engine: sa.Engine, n: int) -> None:
    with begin_write(engine) as conn:
        operations.resolve_pending_retries(conn, [message_uuid(n)], NOW)


def compact(engine: sa.Engine) -> None:
    tallies.fold_deltas(engine)


def sweep(engine: sa.Engine, body_store: FileSystemBodyStore) -> None:
    sweep_expired_failed_messages(
        engine, body_store, retention_period=timedelta(seconds=1), now=NOW + timedelta(days=1)
    )


message = st.integers(0, MESSAGES - 1)
step = st.one_of(
    st.tuples(st.just("ingest"), message, st.integers(0, 30), st.integers(0, 8)),
    st.tuples(st.just("archive"), message),
    st.tuples(st.just("unarchive"), message),
    st.tuples(st.just("archive_group"), st.integers(0, 8)),
    st.tuples(st.just("unarchive_group"), st.integers(0, 8)),
    st.tuples(st.just("retry"), message),
    st.tuples(st.just("confirm"), message),
    st.tuples(st.just("resolve"), message),
    st.tuples(st.just("sweep")),
    st.tuples(st.just("compact")),
)
OPERATIONS: dict[str, Any] = {
    "ingest": ingest,
    "archive": archive,
    "unarchive": unarchive,
    "archive_group": archive_group,
    "unarchive_group": unarchive_group,
    "retry": retry,
    "confirm": confirm,
    "resolve": resolve,
    "compact": compact,
}


def apply(engine: sa.Engine, body_store: FileSystemBodyStore, operation: tuple[Any, ...]) -> None:
    name, *arguments = operation
    if name == "sweep":
        sweep(engine, body_store)
    else:
        OPERATIONS[name](engine, *arguments)


def random_operation(rng: random.Random, names: Sequence[str]) -> tuple[Any, ...]:
    """One of ``names`` with random arguments, as the concurrent writers run them."""
    operation = rng.choice(list(names))
    if operation == "ingest":
        return (operation, rng.randrange(MESSAGES), rng.randrange(60), rng.randrange(9))
    if operation in ("archive_group", "unarchive_group"):
        return (operation, rng.randrange(9))
    if operation in ("sweep", "compact", "fold"):
        return (operation,)
    return (operation, rng.randrange(MESSAGES))


# --- the comparison -----------------------------------------------------------------------
def design_aggregate(conn: sa.Connection, status: FailedMessageStatus) -> list[tuple[Any, ...]]:
    """Per group: (id, title, classifier, count, first, last) over its messages in
    ``status``, joined to the messages themselves; latest last first, then by id."""
    last = sa.func.max(fm.last_failure_at)
    rows = conn.execute(
        sa.select(
            fmg.group_id,
            fmg.title,
            fmg.classifier,
            sa.func.count(),
            sa.func.min(fm.first_failure_at),
            last,
        )
        .join_from(failed_message_groups, failed_messages, fm.id == fmg.failed_message_id)
        .where(fm.status == int(status))
        .group_by(fmg.group_id, fmg.title, fmg.classifier)
        .order_by(last.desc(), fmg.group_id)
    ).all()
    return [tuple(row) for row in rows]


def as_tuple(group: groups.GroupSummary) -> tuple[Any, ...]:
    return (group.id, group.title, group.classifier, group.count, group.first, group.last)


def assert_views_equal_aggregate(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        copies = conn.execute(
            sa.select(fmg.failed_message_id, fmg.group_id)
            .join_from(failed_message_groups, failed_messages, fm.id == fmg.failed_message_id)
            .where(
                sa.or_(
                    fmg.status.is_distinct_from(fm.status),
                    fmg.first_failure_at.is_distinct_from(fm.first_failure_at),
                    fmg.last_failure_at.is_distinct_from(fm.last_failure_at),
                )
            )
        ).all()
        assert copies == []
        key = (fmg.classifier, fmg.group_id, fmg.status)
        group_rows = conn.execute(sa.select(*key, sa.func.count()).group_by(*key)).all()
        total = sa.func.sum(counts.n)
        counted = conn.execute(
            sa.select(counts.classifier, counts.group_id, counts.status, total)
            .group_by(counts.classifier, counts.group_id, counts.status)
            .having(total != 0)
        ).all()
        assert sorted(map(tuple, counted)) == sorted(map(tuple, group_rows))
        for status in (FailedMessageStatus.UNRESOLVED, FailedMessageStatus.ARCHIVED):
            expected = design_aggregate(conn, status)
            for classifier in CLASSIFIERS:
                shown = [as_tuple(g) for g in groups.list_groups(conn, classifier, status=status)]
                assert shown == [row for row in expected if row[2] == classifier]
            for row in expected:
                found = groups.get_group(conn, row[0], status=status)
                assert found is not None and as_tuple(found) == row
                where = FailedMessageFilter(group_id=row[0], statuses=frozenset({status}))
                assert count_failed_messages(conn, where) == row[3]


def clear(engine: sa.Engine) -> None:
    with begin_write(engine) as conn:
        for table in ("failed_message_retries", "retry_batches", "retry_operations"):
            conn.execute(sa.text(f"DELETE FROM {table}"))
        conn.execute(sa.delete(failed_message_groups))
        conn.execute(sa.delete(failed_messages))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(step, min_size=1, max_size=25))
def test_groups_views_equal_the_aggregate_after_any_operations(
    engine: sa.Engine, tmp_path: Path, steps: list[tuple[Any, ...]]
) -> None:
    body_store = FileSystemBodyStore(tmp_path / "bodies")
    clear(engine)
    for operation in steps:
        apply(engine, body_store, operation)
        assert_views_equal_aggregate(engine)


def test_groups_views_equal_the_aggregate_under_two_concurrent_writers(
    postgresql_url: str, tmp_path: Path
) -> None:
    engine = create_store_engine(postgresql_url)
    upgrade_database(engine)
    body_store = FileSystemBodyStore(tmp_path / "bodies")
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        retrying = retry_transient(max_backoff_seconds=0.2)
        try:
            barrier.wait(timeout=30)
            for _ in range(150):
                operation = random_operation(rng, [*OPERATIONS, "sweep"])
                for try_ in retrying:
                    with try_:
                        apply(engine, body_store, operation)
        except BaseException as exc:  # collected, asserted after join
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert_views_equal_aggregate(engine)
    engine.dispose()


@pytest.mark.parametrize(
    "order",
    [Ordering(k, d) for k in SORT_KEYS for d in (True, False)],
    ids=lambda order: f"{order.key}-{'desc' if order.descending else 'asc'}",
)
def test_a_groups_page_is_the_same_read_from_its_rows_or_joined(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch, order: Ordering
) -> None:
    """``list_failed_messages`` reads a group's page from its group rows where they hold
    the sort key (walking their index of it, or read and sorted), else from its ids joined
    to the messages: both give the same rows in the same order. Some messages fail again
    later, so that their last failure sorts them otherwise than their first."""
    for n in range(12):
        ingest(engine, n, 30 - n if n % 3 else n, choice=0 if n < 9 else 1)
    for n in (1, 4, 6, 10):
        ingest(engine, n, 60 + n, choice=0 if n < 9 else 1)
    archive(engine, 2)
    archive(engine, 5)
    group = groups_of(0)[0].id
    filters = [
        FailedMessageFilter(group_id=group),
        FailedMessageFilter(group_id=group, statuses=frozenset({FailedMessageStatus.UNRESOLVED})),
    ]

    def pages() -> list[list[str]]:
        with engine.connect() as conn:
            return [
                [
                    item.id
                    for item in list_failed_messages(
                        conn, offset=offset, limit=4, where=where, order=order
                    ).items
                ]
                for where in filters
                for offset in (0, 4, 8)
            ]

    from_ids = pages()
    monkeypatch.setattr(lists, "_group_rows_hold", lambda *_: False)
    joined = pages()
    assert joined == from_ids
    assert sum(map(len, from_ids)) == 9 + 7


# --- the writer's own copies (migration 0013: the insert trigger skips its rows) -----------
def group_copies(engine: sa.Engine, n: int) -> list[tuple[Any, ...]]:
    """(group id, status, first, last) of message ``n``'s group rows, and the message's
    own (status, first, last) as the last item."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(fmg.group_id, fmg.status, fmg.first_failure_at, fmg.last_failure_at)
            .where(fmg.failed_message_id == message_uuid(n))
            .order_by(fmg.group_id)
        ).all()
        own = conn.execute(
            sa.select(fm.status, fm.first_failure_at, fm.last_failure_at).where(
                fm.id == message_uuid(n)
            )
        ).one()
    return [tuple(row) for row in rows] + [tuple(own)]


def test_the_writers_group_rows_carry_the_messages_values_not_the_batchs(
    engine: sa.Engine,
) -> None:
    """The group rows a batch writes take the message as its upsert left it: a later
    attempt of an archived message reopens it (Unresolved) and widens its failure window
    from the stored first failure to the batch's; the batch's own first failure, status
    and the stored status are all wrong copies."""
    ingest(engine, 0, 10, choice=0)
    archive(engine, 0)
    writer = FailedMessageBatchWriter(engine, clock=lambda: NOW)
    writer.write(
        IngestionBatch(
            attempts=[
                attempt(0, at(20), groups=groups_of(4)),
                attempt(0, at(30), groups=groups_of(4)),
                attempt(1, at(25), groups=groups_of(4)),
            ]
        )
    )
    unresolved = int(FailedMessageStatus.UNRESOLVED)
    assert group_copies(engine, 0) == [
        *sorted((g.id, unresolved, at(10), at(30)) for g in groups_of(4)),
        (unresolved, at(10), at(30)),
    ]
    assert group_copies(engine, 1) == [
        *sorted((g.id, unresolved, at(25), at(25)) for g in groups_of(4)),
        (unresolved, at(25), at(25)),
    ]
    assert_views_equal_aggregate(engine)


def test_a_batch_that_writes_and_resolves_a_message_leaves_resolved_copies(
    engine: sa.Engine,
) -> None:
    """A batch holding a new attempt of a message and its retry's confirmation: the
    message ends Resolved, and so do the group rows the batch wrote for it."""
    ingest(engine, 0, 10, choice=0)
    writer = FailedMessageBatchWriter(engine, clock=lambda: NOW)
    writer.write(
        IngestionBatch(
            attempts=[attempt(0, at(20), groups=groups_of(5))],
            confirmed_retries=[message_uuid(0)],
        )
    )
    resolved = int(FailedMessageStatus.RESOLVED)
    assert group_copies(engine, 0) == [
        *sorted((g.id, resolved, at(10), at(20)) for g in groups_of(5)),
        (resolved, at(10), at(20)),
    ]
    assert_views_equal_aggregate(engine)


def test_a_group_row_inserted_without_its_copies_gets_them_from_its_message(
    engine: sa.Engine,
) -> None:
    """Any inserter but the writer may leave the copies out, all or some: the insert
    trigger fills all three from the message."""
    ingest(engine, 0, 10, choice=0)
    archive(engine, 0)
    extra = GROUPS["Kind"][2], GROUPS["Place"][2]
    with begin_write(engine) as conn:
        for group, given in zip(extra, ({}, {"status": 1}), strict=True):
            conn.execute(
                sa.insert(failed_message_groups).values(
                    failed_message_id=message_uuid(0),
                    group_id=group.id,
                    classifier=group.classifier,
                    title=group.title,
                    **given,
                )
            )
    archived = int(FailedMessageStatus.ARCHIVED)
    assert group_copies(engine, 0) == [
        *sorted((g.id, archived, at(10), at(10)) for g in (*groups_of(0), *extra)),
        (archived, at(10), at(10)),
    ]
