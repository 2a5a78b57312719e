"""Search terms written by the process, on every provider: what the tokenizer's tests
promise holds through the store's index, nothing in a user's text errors, the bound of a
huge body, and the index is left alone when a row's terms do not change."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.providers import SearchQuery, SearchTerms, provider_for
from controlroom.db.tables import failed_messages
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.search_terms import MAX_TERMS
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt
from controlroom.errors.read.search import search_failed_messages
from tests.factories import at
from tests.nsb import failed_headers

GUID = "3a70adf2-2ade-430b-a91b-b33b000cea13"
LITERAL = "C:\\Temp\\outbox & inbound | !never :* \"quoted\" 'single' back\\slash"


def failure(message_id: str, body: bytes = b"{}", **headers: str) -> FailedAttempt:
    values = failed_headers(message_id) | headers
    return parse_failed_message(values, body, max_body_size_to_store=2_000_000)


def found(engine: sa.Engine, text: str) -> set[str]:
    with engine.connect() as conn:
        page = search_failed_messages(conn, text, offset=0, limit=50)
    return {hit.summary.id for hit in page.items}


@pytest.fixture
def corpus(writer: FailedMessageBatchWriter) -> dict[str, FailedAttempt]:
    messages = {
        "literal": failure("m-literal", **{"Shop.Note": LITERAL}),
        "sequence": failure(f"{{{GUID}}}\\16389"),
        "cyrillic": failure("m-cyrillic", "Ошибка обработки заказа".encode()),
        "cjk": failure("m-cjk", **{"NServiceBus.ExceptionInfo.Message": "注文処理 に失敗しました"}),
        "other": failure("m-other"),
    }
    writer.write(IngestionBatch(attempts=list(messages.values())))
    return messages


def ids(corpus: dict[str, FailedAttempt], *names: str) -> set[str]:
    return {corpus[name].unique_message_id for name in names}


@pytest.mark.parametrize(
    "text",
    [
        LITERAL,
        "C:\\Temp\\outbox",
        "outbox & inbound",
        "inbound | !never",
        "!never",
        "never:*",
        '"quoted"',
        "'single'",
        "back\\slash",
    ],
)
def test_text_with_query_syntax_is_found_literally(
    engine: sa.Engine, corpus: dict[str, FailedAttempt], text: str
) -> None:
    assert found(engine, text) == ids(corpus, "literal")


@pytest.mark.parametrize(
    "text", ["&", "|", "!", ":*", "'", '"', "\\", "& | ! :* ' \" \\", "a:* & !b | 'c'", "\\'"]
)
def test_query_syntax_alone_never_errors(
    engine: sa.Engine, corpus: dict[str, FailedAttempt], text: str
) -> None:
    found(engine, text)  # no exception: the text is never read as syntax


@pytest.mark.parametrize(
    "terms",
    [
        SearchTerms(words=("c:\\temp\\outbox",)),
        SearchTerms(prefixes=("c:\\temp\\out",)),
        SearchTerms(words=("inbound", "c:\\temp\\outbox")),
        SearchTerms(words=("x' | 'inbound",)),
        SearchTerms(words=("x\\' | 'inbound",)),
        SearchTerms(prefixes=("x':* | 'inbound",)),
        SearchTerms(words=('inbound" OR "outbox',)),
    ],
)
def test_a_term_holding_query_syntax_is_one_lexeme(
    engine: sa.Engine, corpus: dict[str, FailedAttempt], terms: SearchTerms
) -> None:
    # The tokenizer never makes such a term (its terms are letters and digits), but the
    # provider binds whatever a term holds as one lexeme: read as syntax, those naming
    # "inbound" would find the message holding it (or the query would fail).
    condition = provider_for(engine.dialect).search_matches(SearchQuery((terms,)))
    with engine.connect() as conn:
        hits = set(conn.scalars(sa.select(failed_messages.c.id).where(condition)))

    assert hits == set()


@pytest.mark.parametrize("text", [f"{{{GUID}}}\\16389", "16389", GUID.upper()])
def test_a_guid_and_sequence_message_id_is_found(
    engine: sa.Engine, corpus: dict[str, FailedAttempt], text: str
) -> None:
    assert found(engine, text) == ids(corpus, "sequence")


def test_non_latin_text_is_found(engine: sa.Engine, corpus: dict[str, FailedAttempt]) -> None:
    assert found(engine, "ошибка") == ids(corpus, "cyrillic")
    assert found(engine, "注文処理") == ids(corpus, "cjk")


def test_a_1_mb_body_is_stored_whole_and_searchable_up_to_the_bound(
    engine: sa.Engine, writer: FailedMessageBatchWriter
) -> None:
    words = [f"word{n}" for n in range(150_000)]
    body = " ".join(words).encode()  # ~1.2 MB of text, stored inline
    message = failure("m-huge", body, **{"NServiceBus.ContentType": "text/plain"})

    writer.write(IngestionBatch(attempts=[message]))

    assert found(engine, "word0") == {message.unique_message_id}
    # Past the bound of terms a message keeps: stored, no longer searchable.
    assert found(engine, f"word{MAX_TERMS + 10}") == set()
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT body_text FROM failed_messages")).scalar_one()
    assert stored == body.decode()


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[sa.Engine]:
    """A migrated SQLite store: the FTS5 trigger's guard is SQLite's alone (PostgreSQL
    writes the same tsvector, and no new row version at all, see test_writer)."""
    eng = create_store_engine(f"sqlite:///{tmp_path / 'controlroom.db'}")
    upgrade_database(eng)
    try:
        yield eng
    finally:
        eng.dispose()


def test_an_older_attempt_leaves_the_full_text_index_alone(sqlite_engine: sa.Engine) -> None:
    engine, writer = sqlite_engine, FailedMessageBatchWriter(sqlite_engine)
    newest = parse_failed_message(
        failed_headers("m-1", failed_at=at(20)), b"{}", max_body_size_to_store=100
    )
    older = parse_failed_message(
        failed_headers("m-1", failed_at=at(10), exception_message="older text"),
        b"{}",
        max_body_size_to_store=100,
    )
    writer.write(IngestionBatch(attempts=[newest]))
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE fts_writes (n INTEGER)")
        conn.exec_driver_sql(
            "CREATE TRIGGER count_fts_writes AFTER UPDATE OF search_vector ON failed_messages "
            "WHEN old.search_vector IS NOT new.search_vector "
            "BEGIN INSERT INTO fts_writes VALUES (1); END"
        )

    writer.write(IngestionBatch(attempts=[older]))  # counted; the payload stays the newest

    with engine.connect() as conn:
        attempts = conn.execute(
            sa.text("SELECT number_of_processing_attempts FROM failed_messages")
        ).scalar_one()
        fts_writes = conn.execute(sa.text("SELECT count(*) FROM fts_writes")).scalar_one()
        trigger = conn.execute(
            sa.text("SELECT sql FROM sqlite_master WHERE name = 'failed_messages_fts_update'")
        ).scalar_one()
    assert attempts == 2
    assert fts_writes == 0
    assert "WHEN old.search_vector IS NOT new.search_vector" in trigger
