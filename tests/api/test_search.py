"""Full-text search of failed messages on every provider: what it finds, what it never
interprets, the result shape, paging, and that it uses the full-text index."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt
from controlroom.errors.read.search import search_condition, search_failed_messages
from tests.factories import at
from tests.nsb import failed_headers

PYTHON_TRACE = (
    "Traceback (most recent call last):\n"
    '  File "/srv/warehouse/app/handlers/stock.py", line 88, in reserve_stock\n'
    "    raise StockLevelError(sku)\n"
    "warehouse.domain.errors.StockLevelError: BLU-CHAIR-04"
)


def failure(message_id: str, body: bytes = b"{}", **headers: str | None) -> FailedAttempt:
    values = failed_headers(message_id) | headers
    return parse_failed_message(values, body, max_body_size_to_store=102_400)


@pytest.fixture
def corpus(writer: FailedMessageBatchWriter) -> dict[str, FailedAttempt]:
    """Failures with terms in one place each: body, one header, type names, a traceback."""
    found = {
        "body": failure("m-body", b'{"OrderId":"ORD-1","Note":"zanzibar delivery"}'),
        "header": failure("m-header", **{"Shop.Tenant": "blueberry"}),
        "dotnet": failure(
            "m-dotnet",
            **{
                "NServiceBus.ExceptionInfo.ExceptionType": "Shop.Sales.OrderRejectedException",
                "NServiceBus.ExceptionInfo.StackTrace": "Shop.Sales.OrderRejectedException: "
                "no stock\n   at Shop.Sales.CreditPolicy.Approve(PlaceOrder message)",
            },
        ),
        "python": failure(
            "m-python",
            **{
                "NServiceBus.ExceptionInfo.ExceptionType": (
                    "warehouse.domain.errors.StockLevelError"
                ),
                "NServiceBus.ExceptionInfo.StackTrace": PYTHON_TRACE,
            },
        ),
        "plain": failure(
            "m-plain", **{"NServiceBus.ExceptionInfo.ExceptionType": "System.TimeoutException"}
        ),
    }
    writer.write(IngestionBatch(attempts=list(found.values())))
    return found


def search(client: TestClient, text: str, **params: Any) -> Any:
    return client.get(f"/api/messages/search/{quote(text, safe='')}", params=params)


def found_ids(response: Any) -> set[str]:
    assert response.status_code == 200, response.text
    return {item["id"] for item in response.json()}


def ids_of(corpus: dict[str, FailedAttempt], *names: str) -> set[str]:
    return {corpus[name].unique_message_id for name in names}


# --- what it finds ------------------------------------------------------------------------
def test_finds_a_term_only_in_the_body(client: TestClient, corpus: dict[str, Any]) -> None:
    assert found_ids(search(client, "zanzibar")) == ids_of(corpus, "body")


def test_finds_a_term_only_in_a_header(client: TestClient, corpus: dict[str, Any]) -> None:
    assert found_ids(search(client, "blueberry")) == ids_of(corpus, "header")


@pytest.mark.parametrize(
    "text",
    [
        "OrderRejectedException",
        "Shop.Sales.OrderRejectedException",
        "Sales.OrderRejectedException",
        "orderrejectedexception",
        "CreditPolicy",
        "Shop.Sales.CreditPolicy.Approve",
        "CreditPolicy.Approve",
    ],
)
def test_finds_a_dotted_net_name_by_a_part_and_by_the_whole(
    client: TestClient, corpus: dict[str, Any], text: str
) -> None:
    assert found_ids(search(client, text)) == ids_of(corpus, "dotnet")


@pytest.mark.parametrize(
    "text",
    [
        "StockLevelError",
        "warehouse.domain.errors.StockLevelError",
        "domain.errors",
        "reserve_stock",
        "/srv/warehouse/app/handlers/stock.py",
        "handlers",
    ],
)
def test_finds_a_python_dotted_path_by_a_part_and_by_the_whole(
    client: TestClient, corpus: dict[str, Any], text: str
) -> None:
    # A "/" cannot travel in a path segment (it would be another segment): use ?q=.
    response = client.get("/api/messages/search", params={"q": text})

    assert found_ids(response) == ids_of(corpus, "python")


def test_finds_system_invalid_operation_exception_by_part_and_whole(
    client: TestClient, corpus: dict[str, Any]
) -> None:
    # tests.nsb's default exception type (and stack trace): in every message but the two
    # whose stack trace the corpus replaces.
    expected = ids_of(corpus, "body", "header", "plain")

    assert found_ids(search(client, "InvalidOperationException")) == expected
    assert found_ids(search(client, "System.InvalidOperationException")) == expected
    assert found_ids(search(client, "System.TimeoutException")) == ids_of(corpus, "plain")


def test_the_servicecontrol_routes_find_any_word(
    client: TestClient, corpus: dict[str, Any]
) -> None:
    assert found_ids(search(client, "zanzibar delivery")) == ids_of(corpus, "body")
    assert found_ids(search(client, "zanzibar blueberry")) == ids_of(corpus, "body", "header")
    # A dotted name is one word: its parts must all occur.
    assert found_ids(search(client, "zanzibar.blueberry")) == set()


def many_words(count: int) -> list[str]:
    """``count`` distinct two-letter words that no message of ``corpus`` holds."""
    letters = "bcdfghjklmnpqrstvwxz"
    return [a + b for a in letters for b in letters][:count]


def test_the_servicecontrol_routes_find_any_of_200_words(
    client: TestClient, corpus: dict[str, Any]
) -> None:
    # Under the length limit, any number of words is one flat condition: 155 words
    # once ran PostgreSQL's compiler out of recursion depth (a 500).
    text = " ".join([*many_words(198), "zanzibar", "blueberry"])

    assert found_ids(search(client, text)) == ids_of(corpus, "body", "header")
    by_query = client.get("/api/messages/search", params={"q": text})
    assert found_ids(by_query) == ids_of(corpus, "body", "header")


def test_the_console_search_takes_200_words_that_must_all_occur(
    engine: sa.Engine, corpus: dict[str, Any]
) -> None:
    with engine.connect() as conn:
        found = search_failed_messages(
            conn, " ".join(many_words(200)), offset=0, limit=10, exact_count_limit=0
        )
        widened = search_failed_messages(
            conn, " ".join([*many_words(199), "zanzibar"]), offset=0, limit=10, widen=True
        )

    assert found.items == []
    assert widened.items == []


def test_every_word_must_occur_in_the_console_search(
    engine: sa.Engine, corpus: dict[str, Any]
) -> None:
    assert found_by_every_word(engine, "zanzibar delivery") == ids_of(corpus, "body")
    assert found_by_every_word(engine, "zanzibar blueberry") == set()


def found_by_every_word(engine: sa.Engine, text: str) -> set[str]:
    """The ids of the messages holding every word of ``text`` (the console's search)."""
    with engine.connect() as conn:
        found = search_failed_messages(conn, text, offset=0, limit=100)
    return {hit.summary.id for hit in found.items}


def test_finds_a_message_by_its_message_id_and_by_its_id(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    target = failure("3a70adf2-2ade-430b-a91b-b33b000cea13")
    others = [failure(f"1df93f45-324e-43b4-88c5-b33b000cea{n:02}") for n in range(3)]
    writer.write(IngestionBatch(attempts=[target, *others]))

    assert found_ids(search(client, "3a70adf2-2ade-430b-a91b-b33b000cea13")) == {
        target.unique_message_id
    }
    assert found_ids(search(client, target.unique_message_id)) == {target.unique_message_id}
    assert found_ids(search(client, target.unique_message_id.upper())) == {target.unique_message_id}


def test_query_parameter_form_is_the_same_search(
    client: TestClient, corpus: dict[str, Any]
) -> None:
    by_query = client.get("/api/messages/search", params={"q": "Sales.OrderRejectedException"})

    assert found_ids(by_query) == ids_of(corpus, "dotnet")
    assert found_ids(client.get("/api/messages/search/", params={"q": "blueberry"})) == (
        ids_of(corpus, "header")
    )


# --- what it never interprets -------------------------------------------------------------
def test_sql_injection_text_finds_nothing_and_harms_nothing(
    client: TestClient, engine: sa.Engine, corpus: dict[str, Any]
) -> None:
    text = "'; DROP TABLE failed_messages; --"
    with engine.connect() as conn:
        before = conn.execute(sa.select(failed_messages).order_by(failed_messages.c.id)).all()

    by_keyword = search(client, text)
    by_query = client.get("/api/messages/search", params={"q": text})

    assert by_keyword.json() == [] and by_keyword.headers["Total-Count"] == "0"
    assert by_query.json() == [] and by_query.headers["Total-Count"] == "0"
    with engine.connect() as conn:
        after = conn.execute(sa.select(failed_messages).order_by(failed_messages.c.id)).all()
    assert after == before
    assert client.get("/api/errors").headers["Total-Count"] == str(len(corpus))
    assert found_ids(search(client, "zanzibar")) == ids_of(corpus, "body")  # index intact


SYNTAX = [
    '"',
    '""',
    '"zanzibar',
    "zanzibar*",
    "*",
    "NEAR",
    "NEAR(zanzibar delivery)",
    "zanzibar NEAR delivery",
    "body_text:zanzibar",
    ":",
    "a:b",
    "-",
    "-zanzibar",
    "zanzibar -delivery",
    "(",
    ")",
    "(zanzibar",
    "zanzibar OR blueberry",
    "zanzibar AND NOT delivery",
    "^zanzibar",
    "{body_text}: zanzibar",
    "zanzibar & blueberry | !x <-> y:*",
    "'",
    "\\",
    "%",
    "_",
    "%zanzibar%",
    "\x00",
    "zanzibar\x00delivery",
    "   ",
    "Ünïcödé ✓ 日本語",
    "a" * 1000,
]


@pytest.mark.parametrize("text", SYNTAX, ids=lambda text: repr(text)[:30])
def test_search_syntax_from_the_user_is_never_interpreted_nor_a_500(
    client: TestClient, corpus: dict[str, Any], text: str
) -> None:
    by_keyword = search(client, text)
    by_query = client.get("/api/messages/search", params={"q": text})

    for response in (by_keyword, by_query):
        assert response.status_code in (200, 404, 422), (text, response.text)
    if by_query.status_code == 200:
        assert by_query.json() == by_keyword.json() or by_keyword.status_code != 200


def test_an_fts_operator_is_a_plain_word(engine: sa.Engine, corpus: dict[str, Any]) -> None:
    # As FTS5 or tsquery syntax these would match; read literally, "OR" and "NEAR" are
    # words that must occur too, and "-" is punctuation between words ("*" ends a prefix).
    assert found_by_every_word(engine, "zanzibar OR blueberry") == set()
    assert found_by_every_word(engine, "NEAR(zanzibar delivery)") == set()
    assert found_by_every_word(engine, "zanzibar*") == ids_of(corpus, "body")
    assert found_by_every_word(engine, "zanzibar -delivery") == ids_of(corpus, "body")


def test_an_overlong_search_is_422_naming_it(client: TestClient) -> None:
    response = client.get("/api/messages/search", params={"q": "a" * 1001})

    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "q"]


def test_an_empty_q_is_422_naming_it(client: TestClient) -> None:
    assert client.get("/api/messages/search", params={"q": ""}).json()["detail"][0]["loc"] == [
        "query",
        "q",
    ]
    assert client.get("/api/messages/search").json()["detail"][0]["loc"] == ["query", "q"]


# --- shape, statuses, paging --------------------------------------------------------------
def test_result_item_has_the_servicecontrol_message_shape(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    first = failure("msg-shape", b'{"OrderId":"ORD-42"}')
    again = parse_failed_message(
        failed_headers("msg-shape", failed_at=at(60)),
        b'{"OrderId":"ORD-42"}',
        max_body_size_to_store=102_400,
    )
    writer.write(IngestionBatch(attempts=[first, again]))

    [item] = search(client, "msg-shape").json()

    headers = dict(again.headers)
    assert item == {
        "id": again.unique_message_id,
        "message_id": "msg-shape",
        "message_type": "Shop.Messages.PlaceOrder",
        "conversation_id": headers["NServiceBus.ConversationId"],
        "is_system_message": False,
        "status": "repeatedFailure",
        "processed_at": "2026-01-01T00:01:00.000000Z",
        "time_sent": "2025-12-31T23:59:59.000000Z",
        "sending_endpoint": {
            "name": "WebShop",
            "host_id": item["sending_endpoint"]["host_id"],
            "host": "WEBHOST",
        },
        "receiving_endpoint": {
            "name": "Sales",
            "host_id": item["receiving_endpoint"]["host_id"],
            "host": "MACHINENAME",
        },
        "body_url": f"/messages/{again.unique_message_id}/body",
        "body_size": len(b'{"OrderId":"ORD-42"}'),
        "headers": [
            {"key": key, "value": value} if value is not None else {"key": key}
            for key, value in sorted(headers.items())
        ],
        "processing_time": "00:00:00",
        "critical_time": "00:00:00",
        "delivery_time": "00:00:00",
    }
    assert client.get("/api" + item["body_url"]).content == b'{"OrderId":"ORD-42"}'


@pytest.mark.parametrize(
    ("status", "attempts", "expected"),
    [
        (FailedMessageStatus.UNRESOLVED, 1, "failed"),
        (FailedMessageStatus.UNRESOLVED, 2, "repeatedFailure"),
        (FailedMessageStatus.RESOLVED, 1, "resolvedSuccessfully"),
        (FailedMessageStatus.ARCHIVED, 3, "archivedFailure"),
        (FailedMessageStatus.RETRY_ISSUED, 2, "retryIssued"),
    ],
)
def test_result_status_is_servicecontrols_message_status(
    client: TestClient,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    status: FailedMessageStatus,
    attempts: int,
    expected: str,
) -> None:
    item = failure("msg-status")
    writer.write(IngestionBatch(attempts=[item]))
    with engine.begin() as conn:
        conn.execute(
            sa.update(failed_messages)
            .where(failed_messages.c.id == item.unique_message_id)
            .values(status=int(status), number_of_processing_attempts=attempts)
        )

    [found] = search(client, "msg-status").json()

    assert found["status"] == expected


def test_results_are_paged_and_sorted_like_errors(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    items = [
        parse_failed_message(
            failed_headers(f"bulk-{n:03}", failed_at=at(n)) | {"Batch": "walrus"},
            b"{}",
            max_body_size_to_store=100,
        )
        for n in range(60)
    ]
    writer.write(IngestionBatch(attempts=items))

    first = search(client, "walrus", sort="time_of_failure")
    second = search(client, "walrus", sort="time_of_failure", page=2)
    ascending = search(client, "walrus", sort="message_id", direction="asc", per_page=5)

    assert first.headers["Total-Count"] == "60"
    assert len(first.json()) == 50 and len(second.json()) == 10
    assert [item["message_id"] for item in first.json()][:2] == ["bulk-059", "bulk-058"]
    assert (
        '<messages/search/walrus?sort=time_of_failure&per_page=50&page=2>; rel="next"'
        in (first.headers["Link"])
    )
    assert first.headers["ETag"] != second.headers["ETag"]
    assert [item["message_id"] for item in ascending.json()] == [f"bulk-{n:03}" for n in range(5)]
    assert search(client, "walrus", sort="nonsense").status_code == 200  # the default sort
    beyond = search(client, "walrus", page=3)
    assert beyond.json() == [] and beyond.headers["Total-Count"] == "60"


# --- the index is what answers ------------------------------------------------------------
def test_search_is_answered_from_the_full_text_index(
    engine: sa.Engine, corpus: dict[str, Any]
) -> None:
    condition = search_condition(engine.dialect, "OrderRejectedException")
    sql = sa.select(failed_messages.c.id).where(condition).compile(engine)
    with engine.connect() as conn:
        cursor = conn.connection.dbapi_connection.cursor()  # the parameters as compiled
        if engine.dialect.name == "postgresql":
            # Tiny tables are cheaper to scan; forbid that to see which index serves.
            cursor.execute("SET enable_seqscan = off")
            cursor.execute("EXPLAIN " + str(sql), sql.params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "ix_failed_messages_search_vector" in plan
        else:
            positional = tuple(sql.params[name] for name in sql.positiontup or ())
            cursor.execute("EXPLAIN QUERY PLAN " + str(sql), positional)
            plan = "\n".join(str(row[-1]) for row in cursor.fetchall())
            assert "VIRTUAL TABLE INDEX" in plan and "failed_messages_fts" in plan
        cursor.close()
    assert "LIKE" not in str(sql).upper()


def test_openapi_describes_both_search_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]

    by_query = paths["/api/messages/search"]["get"]
    by_keyword = paths["/api/messages/search/{keyword}"]["get"]

    assert {p["name"] for p in by_query["parameters"]} >= {"q", "page", "per_page", "sort"}
    assert {p["name"] for p in by_keyword["parameters"]} >= {"keyword", "page", "per_page"}
    item = json.dumps(by_query["responses"]["200"])
    assert "MessageSearchItem" in item
