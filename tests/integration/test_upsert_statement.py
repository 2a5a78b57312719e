"""The conditional upsert's statement as the providers send it (docs/decisions.md "Write
statements have a fixed shape"): values
that are awkward for the way rows travel (one array per column on PostgreSQL, multi-row
``VALUES`` on SQLite) are stored exactly and every guard of docs/design.md "The conditional
upsert" holds over them; on PostgreSQL the statement has one text whatever the number of
rows, and the server prepares it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import sqlalchemy as sa

from controlroom.db.engine import begin_write, create_store_engine
from controlroom.db.errors import classify_store_error
from controlroom.db.migrate import upgrade_database
from controlroom.db.providers import provider_for
from controlroom.db.tables import failed_messages
from controlroom.errors.ingest.fold import fold_attempts
from controlroom.errors.ingest.upsert import upsert_failed_messages
from controlroom.errors.ingest.writer import (
    FailedMessageBatchWriter,
    IngestionBatch,
    failed_message_row,
)
from controlroom.errors.model import BodyPlacement, FailedAttempt
from controlroom.exceptions import ErrorKind
from tests.factories import at, attempt, message_uuid

# Text that means something to an array literal, to JSON or to SQL, or is long or not ASCII.
AWKWARD_TEXTS = (
    "",
    "NULL",
    "null",
    '"quoted"',
    "back\\slash\\",
    "{braces},commas,",
    "tab\tnew line\ncarriage\r",
    "\x01\x1fcontrol",
    "ünïcödé \u2013 \u2713",  # en dash, check mark
    "emoji \U0001f600 and \U0001d518\U0001d52b",  # four UTF-8 bytes each
    "日本語のテキスト",
    "  leading and trailing spaces  ",
)
LONG_TEXT = "x" * 300_000  # for the unbounded text columns only
TEXT_COLUMNS = ("exception_message", "exception_source", "stack_trace")


def awkward_attempt(n: int, seconds: float, shift: int = 0) -> FailedAttempt:
    """Attempt ``n`` failing at ``seconds`` whose text columns hold awkward texts (picked by
    ``n + shift``) and, for some ``n``, nothing at all (``None`` among values)."""
    base = attempt(n, at(seconds))

    def pick(offset: int, texts: tuple[str, ...] = (*AWKWARD_TEXTS, LONG_TEXT)) -> str | None:
        index = (n + shift + offset) % (len(texts) + 1)
        return None if index == len(texts) else texts[index]

    body_text = pick(5)
    return dataclasses.replace(
        base,
        # Indexed or varchar(400): short texts (a b-tree entry holds at most 2,704 bytes).
        conversation_id=pick(3, AWKWARD_TEXTS),
        message_type=pick(4, AWKWARD_TEXTS),
        time_sent=at(seconds - 1) if n % 3 else None,
        is_system_message=n % 2 == 0,
        body_placement=BodyPlacement(
            size=len((body_text or "").encode()), text=body_text, external=False
        ),
        **{name: pick(offset) for offset, name in enumerate(TEXT_COLUMNS)},
    )


def stored_rows(engine: sa.Engine) -> dict[str, dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(failed_messages)).mappings().all()
    return {row["id"]: dict(row) for row in rows}


def row_versions(engine: sa.Engine) -> Any:
    """PostgreSQL's ``xmin`` of each row (a new row version has a new one); elsewhere the
    rows themselves."""
    with engine.connect() as conn:
        if engine.dialect.name != "postgresql":
            return stored_rows(engine)
        return conn.execute(sa.text("SELECT id, xmin::text FROM failed_messages ORDER BY id")).all()


def assert_payload_of(row: dict[str, Any], source: FailedAttempt) -> None:
    for name in (
        *TEXT_COLUMNS,
        "message_type",
        "conversation_id",
        "time_sent",
        "is_system_message",
    ):
        assert row[name] == getattr(source, name), name
    assert row["body_text"] == source.body_placement.text


def test_awkward_values_are_stored_exactly_and_every_guard_holds_over_them(
    engine: sa.Engine,
) -> None:
    count = 63  # two statements: 50 rows and 13
    now = [at(1000)]
    writer = FailedMessageBatchWriter(engine, clock=lambda: now[0])
    first = [awkward_attempt(n, 100 + n) for n in range(count)]
    writer.write(IngestionBatch(attempts=first))
    rows = stored_rows(engine)
    assert len(rows) == count
    for source in first:
        assert_payload_of(rows[source.unique_message_id], source)

    # A replay, later, writes nothing: no new row version, last_modified unchanged.
    versions = row_versions(engine)
    now[0] = at(2000)
    writer.write(IngestionBatch(attempts=first))
    assert row_versions(engine) == versions

    # Older attempts with other texts: counted, window widened, payload kept.
    older = [awkward_attempt(n, 10 + n, shift=3) for n in range(count)]
    writer.write(IngestionBatch(attempts=older))
    rows = stored_rows(engine)
    for source, old in zip(first, older, strict=True):
        row = rows[source.unique_message_id]
        assert row["number_of_processing_attempts"] == 2
        assert (row["first_failure_at"], row["last_failure_at"]) == (
            old.time_of_failure,
            source.time_of_failure,
        )
        assert_payload_of(row, source)

    # Newer attempts: counted, and their payload replaces the stored one.
    newer = [awkward_attempt(n, 500 + n, shift=7) for n in range(count)]
    writer.write(IngestionBatch(attempts=[*newer, *older]))  # the older ones again, too
    rows = stored_rows(engine)
    for source in newer:
        row = rows[source.unique_message_id]
        assert row["number_of_processing_attempts"] == 3
        assert row["last_failure_at"] == source.time_of_failure
        assert_payload_of(row, source)


def test_a_value_longer_than_its_column_is_refused_or_kept_whole_never_cut(
    engine: sa.Engine,
) -> None:
    # Parsing refuses such a value first; the store is the last line: PostgreSQL refuses
    # it as the input's fault, SQLite (no length limits) keeps it whole.
    conversation_id = "c" * 401
    long = dataclasses.replace(attempt(0, at(10)), conversation_id=conversation_id)
    row = failed_message_row(fold_attempts([long])[0], at(20))
    provider = provider_for(engine)
    try:
        with begin_write(engine) as conn:
            upsert_failed_messages(conn, provider, [row])
    except sa.exc.DBAPIError as refused:
        assert classify_store_error(refused) is ErrorKind.DATA
        assert stored_rows(engine) == {}
    else:
        assert stored_rows(engine)[message_uuid(0)]["conversation_id"] == conversation_id


def upsert_texts(engine: sa.Engine, batches: list[list[FailedAttempt]]) -> list[str]:
    texts: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("INSERT INTO FAILED_MESSAGES "):
            texts.append(statement)

    writer = FailedMessageBatchWriter(engine)
    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        for batch in batches:
            writer.write(IngestionBatch(attempts=batch))
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)
    return texts


@pytest.fixture
def postgresql_engine(postgresql_url: str) -> Any:
    engine = create_store_engine(postgresql_url)
    upgrade_database(engine)
    try:
        yield engine
    finally:
        engine.dispose()


def test_postgresql_upsert_has_one_text_for_1_row_and_for_50(
    postgresql_engine: sa.Engine,
) -> None:
    # SQLite keeps multi-row VALUES (one text per chunk size; see benchmarks/README.md).
    one = [attempt(0, at(1))]
    fifty = [attempt(n, at(2 + n)) for n in range(1, 51)]
    seventy_three = [attempt(n, at(100 + n)) for n in range(51, 124)]  # 50 rows, then 23

    texts = upsert_texts(postgresql_engine, [one, fifty, seventy_three])

    assert len(texts) == 4
    assert len(set(texts)) == 1
    assert "unnest" in texts[0]


def test_postgresql_prepares_the_upsert_on_the_server(postgresql_engine: sa.Engine) -> None:
    provider = provider_for(postgresql_engine)
    with begin_write(postgresql_engine) as conn:
        for n in range(8):  # past psycopg's prepare_threshold (5 runs of one text)
            rows = [
                failed_message_row(message, at(1000))
                for message in fold_attempts([attempt(n * 10 + k, at(n)) for k in range(n + 1)])
            ]
            upsert_failed_messages(conn, provider, rows)
        prepared = conn.execute(
            sa.text("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
        ).scalars()
        assert any(text.startswith("INSERT INTO failed_messages") for text in prepared)
