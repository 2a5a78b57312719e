"""The batch writer's rules (docs/design.md "Writer", "The conditional upsert"), per provider."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from controlroom.db.engine import begin_write
from controlroom.db.providers import provider_for
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_groups,
    failed_message_retries,
    failed_messages,
    known_endpoints,
    retry_batches,
)
from controlroom.errors.ingest.fold import fold_attempts
from controlroom.errors.ingest.upsert import COUNTED_FAILURE_TIMES, upsert_failed_messages
from controlroom.errors.ingest.writer import (
    FailedMessageBatchWriter,
    IngestionBatch,
    failed_message_row,
)
from controlroom.errors.model import FailedAttempt, FailureGroup
from tests.factories import at, attempt, endpoint, message_uuid


def stored_row(engine: sa.Engine, n: int = 0) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(failed_messages).where(failed_messages.c.id == message_uuid(n))
        ).one()
    return dict(row._mapping)


def row_count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()


def set_status(engine: sa.Engine, status: FailedMessageStatus, n: int = 0) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.update(failed_messages)
            .where(failed_messages.c.id == message_uuid(n))
            .values(status=int(status), status_changed_at=at(-1000))
        )


def test_three_failures_in_three_batches_make_one_row(engine: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(engine)
    for seconds in (10, 20, 30):
        writer.write(IngestionBatch(attempts=[attempt(0, at(seconds))]))

    row = stored_row(engine)
    assert row_count(engine, failed_messages) == 1
    assert row["number_of_processing_attempts"] == 3
    assert (row["first_failure_at"], row["last_failure_at"]) == (at(10), at(30))
    assert row["exception_message"] == attempt(0, at(30)).exception_message


def test_older_attempt_after_newer_grows_count_and_window_but_keeps_payload(
    engine: sa.Engine,
) -> None:
    writer = FailedMessageBatchWriter(engine)
    writer.write(IngestionBatch(attempts=[attempt(0, at(20))]))
    writer.write(IngestionBatch(attempts=[attempt(0, at(10))]))

    row = stored_row(engine)
    assert row["number_of_processing_attempts"] == 2
    assert (row["first_failure_at"], row["last_failure_at"]) == (at(10), at(20))
    assert row["exception_message"] == attempt(0, at(20)).exception_message
    assert row["body_text"] == attempt(0, at(20)).body_placement.text


def test_redelivery_of_the_stored_attempt_changes_nothing(engine: sa.Engine) -> None:
    clock_now = [at(100)]
    writer = FailedMessageBatchWriter(engine, clock=lambda: clock_now[0])
    batch = IngestionBatch(attempts=[attempt(0, at(10)), attempt(0, at(20))])
    writer.write(batch)
    before = stored_row(engine)

    clock_now[0] = at(200)
    writer.write(batch)

    assert stored_row(engine) == before
    assert before["number_of_processing_attempts"] == 2


def test_resolved_or_archived_message_that_fails_again_is_unresolved(engine: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(engine, clock=lambda: at(500))
    for n, status in enumerate((FailedMessageStatus.RESOLVED, FailedMessageStatus.ARCHIVED)):
        writer.write(IngestionBatch(attempts=[attempt(n, at(10))]))
        set_status(engine, status, n)

        writer.write(IngestionBatch(attempts=[attempt(n, at(20))]))

        row = stored_row(engine, n)
        assert row["status"] == FailedMessageStatus.UNRESOLVED
        assert row["status_changed_at"] == at(500)


def test_unresolved_message_failing_again_keeps_its_status_changed_at(engine: sa.Engine) -> None:
    clock_now = [at(100)]
    writer = FailedMessageBatchWriter(engine, clock=lambda: clock_now[0])
    writer.write(IngestionBatch(attempts=[attempt(0, at(10))]))
    clock_now[0] = at(200)
    writer.write(IngestionBatch(attempts=[attempt(0, at(20))]))

    row = stored_row(engine)
    assert row["status_changed_at"] == at(100)
    assert row["last_modified"] == at(200)


def test_fails_and_is_retry_confirmed_in_one_batch_ends_resolved(engine: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(engine)
    writer.write(IngestionBatch(attempts=[attempt(0, at(10))]))
    with engine.begin() as conn:
        conn.execute(
            sa.insert(retry_batches).values(
                id=message_uuid(999),
                request_id="r",
                retry_type="One",
                status="Done",
                initial_batch_size=1,
                started_at=at(0),
                last_modified=at(0),
            )
        )
        conn.execute(
            sa.insert(failed_message_retries).values(
                failed_message_id=message_uuid(0), retry_batch_id=message_uuid(999)
            )
        )

    writer.write(IngestionBatch(attempts=[attempt(0, at(20))], confirmed_retries=[message_uuid(0)]))

    assert stored_row(engine)["status"] == FailedMessageStatus.RESOLVED
    assert row_count(engine, failed_message_retries) == 0


def test_existing_endpoint_monitored_flag_is_never_overwritten(engine: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(engine)
    writer.write(IngestionBatch(endpoints=[endpoint("Sales")]))
    with engine.begin() as conn:
        conn.execute(sa.update(known_endpoints).values(monitored=True, host="user-edited"))

    writer.write(IngestionBatch(endpoints=[endpoint("Sales"), endpoint("Billing")]))

    with engine.connect() as conn:
        rows = {r.name: r for r in conn.execute(sa.select(known_endpoints))}
    assert rows["Sales"].monitored is True
    assert rows["Sales"].host == "user-edited"
    assert rows["Billing"].monitored is False


def test_two_attempts_of_one_id_in_one_batch_write_one_row(engine: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(engine)
    writer.write(
        IngestionBatch(attempts=[attempt(0, at(20)), attempt(0, at(10)), attempt(0, at(20))])
    )

    row = stored_row(engine)
    assert row_count(engine, failed_messages) == 1
    assert row["number_of_processing_attempts"] == 2
    assert row["exception_message"] == attempt(0, at(20)).exception_message


def test_batch_larger_than_one_statement_chunk(engine: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(engine)
    writer.write(IngestionBatch(attempts=[attempt(n, at(n)) for n in range(173)]))
    writer.write(IngestionBatch(attempts=[attempt(n, at(1000 + n)) for n in range(173)]))

    with engine.connect() as conn:
        counts = (
            conn.execute(sa.select(failed_messages.c.number_of_processing_attempts)).scalars().all()
        )
    assert sorted(counts) == [2] * 173


def test_groups_follow_the_stored_attempt(engine: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(engine)
    writer.write(IngestionBatch(attempts=[attempt(0, at(20), exception_message="newest")]))
    writer.write(IngestionBatch(attempts=[attempt(0, at(10), exception_message="older")]))
    writer.write(IngestionBatch(attempts=[attempt(0, at(20), exception_message="newest")]))

    with engine.connect() as conn:
        titles = conn.execute(sa.select(failed_message_groups.c.title)).scalars().all()
    assert titles == ["newest"]

    writer.write(IngestionBatch(attempts=[attempt(0, at(30), exception_message="latest")]))
    with engine.connect() as conn:
        titles = conn.execute(sa.select(failed_message_groups.c.title)).scalars().all()
    assert titles == ["latest"]


def test_upsert_is_one_set_based_statement_per_chunk_of_at_most_50_rows(
    engine: sa.Engine,
) -> None:
    statements: list[tuple[str, Any]] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("INSERT INTO FAILED_MESSAGES "):
            statements.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        FailedMessageBatchWriter(engine).write(
            IngestionBatch(attempts=[attempt(n, at(n)) for n in range(173)])
        )
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)

    # One statement per chunk (however the provider binds its rows: multi-row VALUES, or
    # one array per column): 50 + 50 + 50 + 23 rows, told by the ids each one carries.
    ids = {message_uuid(n) for n in range(173)}
    assert [len(ids & set(bound_values(parameters))) for _, parameters in statements] == [
        50,
        50,
        50,
        23,
    ]
    assert all("ON CONFLICT" in sql for sql, _ in statements)
    assert row_count(engine, failed_messages) == 173


def bound_values(parameters: Any) -> list[Any]:
    """Every value bound to a statement, arrays and mappings flattened."""
    if isinstance(parameters, dict):
        parameters = list(parameters.values())
    if isinstance(parameters, (list, tuple)):
        return [value for item in parameters for value in bound_values(item)]
    return [parameters]


# --- exact attempt counts (docs/decisions.md "Attempts are counted exactly") ---------------
def attempts_after(engine: sa.Engine, *batches: list[int]) -> int:
    writer = FailedMessageBatchWriter(engine)
    for seconds in batches:
        writer.write(IngestionBatch(attempts=[attempt(0, at(s)) for s in seconds]))
    return stored_row(engine)["number_of_processing_attempts"]


def test_an_older_attempt_replayed_is_counted_once(engine: sa.Engine) -> None:
    # The seed's rule counted the replayed t5 again: 3.
    assert attempts_after(engine, [10], [5], [5]) == 2


def test_a_redelivered_stored_attempt_beside_a_new_one_is_counted_once(engine: sa.Engine) -> None:
    # The seed's rule added the batch's whole count: 3.
    assert attempts_after(engine, [10], [10, 20]) == 2


def test_a_new_older_attempt_beside_the_redelivered_stored_one_is_counted(
    engine: sa.Engine,
) -> None:
    # The seed's rule saw the batch's last attempt equal the stored one and added nothing: 1.
    assert attempts_after(engine, [10], [5, 10]) == 2


def test_an_archived_message_whose_older_attempt_is_redelivered_stays_archived(
    engine: sa.Engine,
) -> None:
    writer = FailedMessageBatchWriter(engine, clock=lambda: at(500))
    writer.write(IngestionBatch(attempts=[attempt(0, at(5)), attempt(0, at(10))]))
    set_status(engine, FailedMessageStatus.ARCHIVED)
    before = stored_row(engine)

    writer.write(IngestionBatch(attempts=[attempt(0, at(5))]))

    after = stored_row(engine)
    assert after["status"] == FailedMessageStatus.ARCHIVED
    assert after["number_of_processing_attempts"] == 2
    assert after == before


def test_a_replayed_batch_leaves_every_row_as_it_was(engine: sa.Engine) -> None:
    clock_now = [at(100)]
    writer = FailedMessageBatchWriter(engine, clock=lambda: clock_now[0])
    writer.write(IngestionBatch(attempts=[attempt(n, at(50 + n)) for n in range(3)]))
    batch = IngestionBatch(
        attempts=[attempt(0, at(10)), attempt(1, at(60)), attempt(2, at(20)), attempt(2, at(52))]
    )
    writer.write(batch)
    before = [stored_row(engine, n) for n in range(3)]
    versions = row_versions(engine)

    clock_now[0] = at(200)
    writer.write(batch)

    assert [stored_row(engine, n) for n in range(3)] == before
    assert row_versions(engine) == versions


def row_versions(engine: sa.Engine) -> list[Any]:
    """PostgreSQL's ``xmin`` of each row (a new row version has a new one); elsewhere the
    rows themselves."""
    with engine.connect() as conn:
        if engine.dialect.name != "postgresql":
            return conn.execute(sa.select(failed_messages).order_by(failed_messages.c.id)).all()
        return conn.execute(sa.text("SELECT id, xmin::text FROM failed_messages ORDER BY id")).all()


def test_a_batch_bringing_nothing_new_leaves_the_groups_alone(engine: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(engine)
    writer.write(IngestionBatch(attempts=[attempt(0, at(10), exception_message="first")]))
    with engine.begin() as conn:
        conn.execute(sa.update(failed_message_groups).values(title="kept as it was"))

    # The same attempt again, with other content: a redelivery changes nothing.
    writer.write(IngestionBatch(attempts=[attempt(0, at(10), exception_message="other")]))

    with engine.connect() as conn:
        titles = conn.execute(sa.select(failed_message_groups.c.title)).scalars().all()
    assert titles == ["kept as it was"]


def test_the_row_keeps_the_most_recent_counted_times_and_past_them_the_seed_rule(
    engine: sa.Engine,
) -> None:
    writer = FailedMessageBatchWriter(engine)
    writer.write(IngestionBatch(attempts=[attempt(0, at(100 + s)) for s in range(40)]))
    row = stored_row(engine)
    assert row["number_of_processing_attempts"] == 40
    assert len(row["counted_failure_times"]) == COUNTED_FAILURE_TIMES == 32

    # Within the kept times: exact.
    writer.write(IngestionBatch(attempts=[attempt(0, at(139)), attempt(0, at(120))]))
    assert stored_row(engine)["number_of_processing_attempts"] == 40
    writer.write(IngestionBatch(attempts=[attempt(0, at(120.5))]))
    assert stored_row(engine)["number_of_processing_attempts"] == 41
    # Older than every kept time: the seed's rule (a lone old attempt counts, a batch
    # whose last attempt is the stored one adds nothing).
    writer.write(IngestionBatch(attempts=[attempt(0, at(100))]))
    assert stored_row(engine)["number_of_processing_attempts"] == 42
    writer.write(IngestionBatch(attempts=[attempt(0, at(101)), attempt(0, at(139))]))
    assert stored_row(engine)["number_of_processing_attempts"] == 42


def test_group_rows_of_a_batch_are_one_statement_of_a_fixed_text(engine: sa.Engine) -> None:
    statements: list[tuple[str, bool]] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        head = statement.split("(")[0].lower()
        # The writes of group rows (the new groups' probe reads them: ingest/writer.py).
        if "failed_message_groups" in head and head.lstrip().startswith(("insert", "delete")):
            statements.append((statement, executemany))

    writer = FailedMessageBatchWriter(engine)
    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        writer.write(IngestionBatch(attempts=[attempt(n, at(n)) for n in range(3)]))
        writer.write(IngestionBatch(attempts=[attempt(n, at(1000 + n)) for n in range(173)]))
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)

    # Per batch: at most one DELETE of the old rows (none where the provider says every
    # message of the batch is new: the first batch on PostgreSQL), then one INSERT of
    # every new row, the same texts for 3 messages and for 173.
    assert not any(executemany for _, executemany in statements)
    deletes = [sql for sql, _ in statements if sql.lstrip().lower().startswith("delete")]
    inserts = [sql for sql, _ in statements if sql.lstrip().lower().startswith("insert")]
    assert len(inserts) == 2 and len(set(inserts)) == 1
    assert len(deletes) in (1, 2) and len(set(deletes)) == 1
    with engine.connect() as conn:
        assert (
            conn.execute(sa.select(sa.func.count()).select_from(failed_message_groups)).scalar_one()
            == 173
        )


# --- group rows of new and of updated messages (docs/decisions.md "The upsert says which
# rows it inserted") ---------------------------------------------------------------------
def group(title: str) -> FailureGroup:
    return FailureGroup(id=str(uuid.uuid5(uuid.NAMESPACE_URL, title)), classifier="T", title=title)


def group_titles(engine: sa.Engine) -> dict[str, set[str]]:
    """The titles of each message's group rows."""
    rows = failed_message_groups.c
    with engine.connect() as conn:
        found = conn.execute(sa.select(rows.failed_message_id, rows.title)).all()
    titles: dict[str, set[str]] = {}
    for message, title in found:
        titles.setdefault(message, set()).add(title)
    return titles


def upserted(engine: sa.Engine, attempts: list[FailedAttempt]) -> dict[str, bool]:
    """Each row the upsert returned for ``attempts``, with whether it says it inserted it."""
    rows = [failed_message_row(message, at(5000)) for message in fold_attempts(attempts)]
    with begin_write(engine) as conn:
        stored = upsert_failed_messages(conn, provider_for(engine), rows)
    return {row.id: bool(row.inserted) for row in stored}


def test_new_and_later_attempts_in_one_batch_end_with_exactly_their_stored_groups(
    engine: sa.Engine,
) -> None:
    writer = FailedMessageBatchWriter(engine)
    writer.write(
        IngestionBatch(
            attempts=[
                attempt(0, at(10), groups=(group("a"), group("shared"))),
                attempt(1, at(10), groups=(group("b"),)),
            ]
        )
    )

    writer.write(
        IngestionBatch(
            attempts=[
                # A later attempt, classified otherwise: its old rows go.
                attempt(0, at(20), groups=(group("c"), group("shared"), group("d"))),
                # The stored attempt again (nothing new): its rows stay as they are.
                attempt(1, at(10), groups=(group("other"),)),
                # New messages, one of them in a group another message has.
                attempt(2, at(20), groups=(group("c"),)),
                attempt(3, at(20), groups=(group("e"), group("f"))),
            ]
        )
    )

    assert group_titles(engine) == {
        message_uuid(0): {"c", "shared", "d"},
        message_uuid(1): {"b"},
        message_uuid(2): {"c"},
        message_uuid(3): {"e", "f"},
    }


def test_the_upsert_never_says_an_updated_row_was_inserted(engine: sa.Engine) -> None:
    upserted(engine, [attempt(0, at(10)), attempt(1, at(10))])

    second = upserted(engine, [attempt(0, at(20)), attempt(1, at(5)), attempt(2, at(20))])

    # Where the provider cannot tell (SQLite), every row is said to be updated.
    assert set(second) == {message_uuid(0), message_uuid(1), message_uuid(2)}
    assert second[message_uuid(0)] is False and second[message_uuid(1)] is False


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_on_postgresql_the_upsert_says_which_rows_it_inserted(engine: sa.Engine) -> None:
    assert upserted(engine, [attempt(0, at(10)), attempt(1, at(10))]) == {
        message_uuid(0): True,
        message_uuid(1): True,
    }

    # Later (0), older (1) and new (2, 3) attempts: only the new rows were inserted.
    assert upserted(
        engine, [attempt(0, at(20)), attempt(1, at(5)), attempt(2, at(20)), attempt(3, at(1))]
    ) == {
        message_uuid(0): False,
        message_uuid(1): False,
        message_uuid(2): True,
        message_uuid(3): True,
    }


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_on_postgresql_only_updated_messages_have_their_old_group_rows_deleted(
    engine: sa.Engine,
) -> None:
    deleted: list[list[str]] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("DELETE FROM FAILED_MESSAGE_GROUPS"):
            ids = {message_uuid(n) for n in range(10)}
            deleted.append(sorted(ids & set(bound_values(parameters))))

    writer = FailedMessageBatchWriter(engine)
    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        writer.write(IngestionBatch(attempts=[attempt(n, at(10)) for n in range(4)]))
        writer.write(
            IngestionBatch(
                attempts=[attempt(1, at(20)), attempt(2, at(10))]
                + [attempt(n, at(10)) for n in range(4, 8)]
            )
        )
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)

    # First batch: every message new, no delete. Second: message 1 updated (2 is a
    # redelivery the upsert skipped, 4-7 are new).
    assert deleted == [[message_uuid(1)]]
    assert group_titles(engine) == {
        message_uuid(n): {attempt(n, at(20 if n == 1 else 10)).exception_message} for n in range(8)
    }
