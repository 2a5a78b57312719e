"""Partial-word search on every provider (docs/design.md "Search"): a word ending in ``*``
finds the words that start with it; the console widens a search that matched nothing
to prefixes and says so, and says why when nothing matched at all; ServiceControl's
routes match plain words whole."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlroom.config import Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.search_terms import MIN_PREFIX_CHARS, message_search_terms
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.model import FailedAttempt
from controlroom.errors.read.search import search_failed_messages
from tests.factories import at
from tests.nsb import failed_headers
from tests.retries.conftest import store_failed

BODIES = {
    "m-1": b"System.InvalidOperationException: the basket is empty",
    "m-2": b"InvalidOperationException again",
    "m-3": b"an invalid input, nothing else",
    "m-4": b"TimeoutException while calling the warehouse",
}


@pytest.fixture
def stored(
    settings: Settings, writer: FailedMessageBatchWriter, body_store: FileSystemBodyStore
) -> dict[str, FailedAttempt]:
    made = {}
    for n, (name, body) in enumerate(BODIES.items()):
        headers = failed_headers(name, endpoint="Sales", failed_at=at(n)) | {
            "NServiceBus.ContentType": "text/plain",
            "NServiceBus.ExceptionInfo.ExceptionType": "Shop.CustomError",
            "NServiceBus.ExceptionInfo.StackTrace": "Shop.CustomError: see body",
        }
        made[name] = store_failed(settings, writer, body_store, headers, body)
    return made


def message_ids(response: Any) -> list[str]:
    assert response.status_code == 200, response.text
    return sorted(item["message_id"] for item in response.json())


def test_a_word_ending_in_a_star_finds_the_words_starting_with_it(
    client: TestClient, stored: dict[str, FailedAttempt]
) -> None:
    assert message_ids(client.get("/api/messages/search/InvalidOperation*")) == ["m-1", "m-2"]
    assert message_ids(client.get("/api/messages/search/invalidop*")) == ["m-1", "m-2"]
    assert message_ids(client.get("/api/messages/search?q=System.InvalidOp*")) == ["m-1"]
    # ServiceControl's routes match a plain word whole.
    assert message_ids(client.get("/api/messages/search/InvalidOperation")) == []


def test_the_console_widens_a_search_that_found_nothing_and_says_so(
    client: TestClient, stored: dict[str, FailedAttempt]
) -> None:
    page = client.get("/messages", params={"q": "InvalidOperation", "status": ""})

    assert page.status_code == 200
    assert "msg-m-1" in page.text or stored["m-1"].unique_message_id in page.text
    assert stored["m-2"].unique_message_id in page.text
    assert stored["m-3"].unique_message_id not in page.text
    assert "No message contains “invalidoperation” as a whole word" in page.text


def test_the_console_says_why_nothing_matched(
    client: TestClient, stored: dict[str, FailedAttempt]
) -> None:
    page = client.get("/messages", params={"q": "zebra InvalidOp*", "status": ""})

    assert page.status_code == 200
    # Widened too: "zebra" matched nothing whole.
    assert (
        "no message contains all of: a word starting with “invalidop”; a word starting with "
        "“zebra”" in page.text
    )
    whole = client.get("/messages", params={"q": "InvalidOperationException", "status": ""})
    assert 'data-testid="search-note"' not in whole.text


def test_a_short_starred_word_is_a_whole_word(
    client: TestClient, stored: dict[str, FailedAttempt]
) -> None:
    assert message_ids(client.get("/api/messages/search/in*")) == []


WORDS = sorted(
    {term for body in BODIES.values() for term in message_search_terms({}, body.decode())}
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(word=st.sampled_from(WORDS), cut=st.integers(min_value=0, max_value=20))
def test_a_prefix_finds_exactly_the_messages_holding_a_word_that_starts_with_it(
    engine: sa.Engine, stored: dict[str, FailedAttempt], word: str, cut: int
) -> None:
    prefix = word[: max(MIN_PREFIX_CHARS, len(word) - cut)]
    expected = sorted(
        name
        for name, body in BODIES.items()
        if any(
            term.startswith(prefix)
            for term in message_search_terms(stored[name].headers, body.decode())
        )
    )

    with engine.connect() as conn:
        found = search_failed_messages(conn, prefix + "*", offset=0, limit=50)

    assert sorted(hit.summary.message_id for hit in found.items) == expected


def test_a_widened_search_pages_as_it_found(
    engine: sa.Engine, stored: dict[str, FailedAttempt]
) -> None:
    with engine.connect() as conn:
        first = search_failed_messages(conn, "InvalidOperation", offset=0, limit=1, widen=True)
        second = search_failed_messages(conn, "InvalidOperation", offset=1, limit=1, widen=True)

    assert (first.total, second.total) == (2, 2)
    assert second.widened == ("invalidoperation",)
    assert {first.items[0].summary.message_id, second.items[0].summary.message_id} == {"m-1", "m-2"}
