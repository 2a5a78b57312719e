"""``GET|HEAD /api/errors`` and ``/api/endpoints/{name}/errors`` on every provider: paging,
``Link``, every sort key both ways, the status, modified and queue filters, ``ETag``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt
from tests.factories import at, attempt, message_uuid
from tests.nsb import failed_headers, nsb_time

STATUS_ORDER = {"unresolved": 1, "resolved": 2, "retryIssued": 3, "archived": 4}


def ids(response: Any) -> list[str]:
    return [item["id"] for item in response.json()]


def set_rows(engine: sa.Engine, n: int, **values: Any) -> None:
    """Set columns of message ``n`` the way an operator action would (status, modified)."""
    with engine.begin() as conn:
        conn.execute(
            sa.update(failed_messages)
            .where(failed_messages.c.id == message_uuid(n))
            .values(**values)
        )


def failure(
    settings: Settings,
    message_id: str,
    *,
    message_type: str | None = "Shop.Messages.PlaceOrder",
    time_sent: datetime | None = None,
    failed_at: datetime | None = None,
    endpoint: str = "Sales",
    queue: str | None = None,
) -> FailedAttempt:
    """A parsed failure with the list's sort columns set as asked (``None``: header absent)."""
    headers = failed_headers(message_id, endpoint=endpoint, failed_at=failed_at or at(0))
    headers.pop("NServiceBus.EnclosedMessageTypes")
    headers.pop("NServiceBus.TimeSent")
    if message_type is not None:
        headers["NServiceBus.EnclosedMessageTypes"] = f"{message_type}, Shop.Messages"
    if time_sent is not None:
        headers["NServiceBus.TimeSent"] = nsb_time(time_sent)
    if queue is not None:
        headers["NServiceBus.FailedQ"] = queue
    return parse_failed_message(headers, b"{}", max_body_size_to_store=1000)


# --- paging -------------------------------------------------------------------------------
@pytest.fixture
def hundred_twenty(writer: FailedMessageBatchWriter) -> list[str]:
    """120 failed messages without time_sent, so the default order is by id, descending."""
    writer.write(IngestionBatch(attempts=[attempt(n, at(n)) for n in range(120)]))
    return [message_uuid(n) for n in range(119, -1, -1)]


def links(response: Any) -> dict[str, str]:
    """``{rel: target}`` of the ``Link`` header."""
    found = {}
    for part in response.headers["Link"].split(", "):
        target, rel = part.split("; ")
        found[rel.removeprefix('rel="').removesuffix('"')] = target.strip("<>")
    return found


def test_120_messages_page_as_three_pages_of_50_with_links(
    client: TestClient, hundred_twenty: list[str]
) -> None:
    pages = [client.get("/api/errors", params={"per_page": 50, "page": n}) for n in (1, 2, 3)]

    assert [r.headers["Total-Count"] for r in pages] == ["120", "120", "120"]
    assert [len(r.json()) for r in pages] == [50, 50, 20]
    assert [item for r in pages for item in ids(r)] == hundred_twenty
    assert links(pages[0]) == {
        "last": "errors?per_page=50&page=3",
        "next": "errors?per_page=50&page=2",
    }
    assert links(pages[1]) == {
        "first": "errors?per_page=50&page=1",
        "prev": "errors?per_page=50&page=1",
        "last": "errors?per_page=50&page=3",
        "next": "errors?per_page=50&page=3",
    }
    assert links(pages[2]) == {
        "first": "errors?per_page=50&page=1",
        "prev": "errors?per_page=50&page=2",
    }


def test_page_0_is_page_1(client: TestClient, hundred_twenty: list[str]) -> None:
    zero = client.get("/api/errors", params={"page": 0})

    assert ids(zero) == hundred_twenty[:50]
    assert links(zero) == links(client.get("/api/errors", params={"page": 1}))


def test_links_keep_the_other_query_parameters(
    client: TestClient, hundred_twenty: list[str]
) -> None:
    response = client.get(
        "/api/errors", params={"status": "unresolved", "sort": "id", "direction": "asc"}
    )

    assert links(response)["next"] == (
        "errors?status=unresolved&sort=id&direction=asc&per_page=50&page=2"
    )


def test_head_answers_the_headers_of_get(client: TestClient, hundred_twenty: list[str]) -> None:
    get = client.get("/api/errors", params={"page": 2})
    head = client.head("/api/errors", params={"page": 2})

    assert head.status_code == 200
    assert head.content == b""
    for name in ("Total-Count", "ETag", "Link"):
        assert head.headers[name] == get.headers[name]


def test_head_is_answered_where_servicecontrol_answers_it(
    client: TestClient, hundred_twenty: list[str]
) -> None:
    """ServiceControl's error instance takes HEAD on ``errors`` and
    ``recoverability/groups/{groupId}/errors`` only (``[HttpHead]`` routes); its
    ``messages`` and ``endpoints/{endpointname}/errors`` are ``[HttpGet]`` alone, which
    ASP.NET Core answers with 405 for HEAD. So do we."""
    assert client.head("/api/errors").status_code == 200
    for path in ("/api/messages", "/api/endpoints/Sales/errors"):
        assert client.get(path).status_code == 200
        assert client.head(path).status_code == 405


def test_trailing_slash_is_the_same_route(client: TestClient, hundred_twenty: list[str]) -> None:
    plain = client.get("/api/errors", params={"page": 2})
    slashed = client.get("/api/errors/", params={"page": 2}, follow_redirects=False)

    assert slashed.status_code == 200
    assert slashed.json() == plain.json()
    assert client.head("/api/errors/", follow_redirects=False).status_code == 200


# --- ETag ---------------------------------------------------------------------------------
def test_etag_is_quoted_stable_and_changes_with_the_answer(
    client: TestClient, engine: sa.Engine, hundred_twenty: list[str]
) -> None:
    first = client.get("/api/errors").headers["ETag"]
    again = client.get("/api/errors").headers["ETag"]
    other_page = client.get("/api/errors", params={"page": 2}).headers["ETag"]
    set_rows(engine, 119, status=int(FailedMessageStatus.ARCHIVED))
    changed = client.get("/api/errors").headers["ETag"]

    assert first.startswith('"') and first.endswith('"') and len(first) > 2
    assert again == first
    assert other_page != first
    assert changed != first


def test_if_none_match_with_the_current_etag_is_304(
    client: TestClient, hundred_twenty: list[str]
) -> None:
    etag = client.get("/api/errors").headers["ETag"]

    unchanged = client.get("/api/errors", headers={"If-None-Match": etag})
    stale = client.get("/api/errors", headers={"If-None-Match": '"stale"'})

    assert unchanged.status_code == 304 and unchanged.content == b""
    assert unchanged.headers["Total-Count"] == "120"
    assert stale.status_code == 200 and len(stale.json()) == 50


# --- sorting ------------------------------------------------------------------------------
SORT_FIELDS = {
    "id": "id",
    "message_id": "message_id",
    "message_type": "message_type",
    "status": "status",
    "time_sent": "time_sent",
    "modified": "last_modified",
    "time_of_failure": "time_of_failure",
}


@pytest.fixture
def varied(
    settings: Settings, engine: sa.Engine, writer: FailedMessageBatchWriter
) -> list[FailedAttempt]:
    """Eight failures with ties and empty values in every nullable sort key."""
    types = ["B.Type", "A.Type", None, "B.Type", "C.Type", None, "A.Type", "D.Type"]
    sent = [at(5), at(1), None, at(5), at(3), at(7), None, at(2)]
    failed = [at(20), at(11), at(15), at(11), at(30), at(12), at(40), at(13)]
    failures = [
        failure(settings, f"msg-{(n * 5) % 8}", message_type=t, time_sent=s, failed_at=f)
        for n, (t, s, f) in enumerate(zip(types, sent, failed, strict=True))
    ]
    writer.write(IngestionBatch(attempts=failures))
    statuses = [1, 4, 2, 1, 3, 4, 1, 2]
    modified = [at(100), at(90), at(100), at(80), at(70), at(60), at(95), at(90)]
    with engine.begin() as conn:
        for item, status, when in zip(failures, statuses, modified, strict=True):
            conn.execute(
                sa.update(failed_messages)
                .where(failed_messages.c.id == item.unique_message_id)
                .values(status=status, last_modified=when)
            )
    return failures


def expected_order(items: list[dict[str, Any]], field: str, descending: bool) -> list[str]:
    """The contract: by the field (empty values smallest), then by id, both one direction."""

    def key(item: dict[str, Any]) -> tuple[bool, Any, str]:
        value = item.get(field)  # null fields are left out of the JSON
        if field == "status":
            value = STATUS_ORDER[value]
        return (value is not None, value if value is not None else 0, item["id"])

    return [item["id"] for item in sorted(items, key=key, reverse=descending)]


@pytest.mark.parametrize("direction", ["asc", "desc"])
@pytest.mark.parametrize("sort", sorted(SORT_FIELDS))
def test_each_sort_key_in_both_directions(
    client: TestClient, varied: list[FailedAttempt], sort: str, direction: str
) -> None:
    response = client.get("/api/errors", params={"sort": sort, "direction": direction})
    items = response.json()

    assert response.status_code == 200
    assert len(items) == 8
    assert ids(response) == expected_order(items, SORT_FIELDS[sort], direction == "desc")


@pytest.mark.parametrize("sort", sorted(SORT_FIELDS))
def test_sorted_pages_neither_overlap_nor_skip(
    client: TestClient, varied: list[FailedAttempt], sort: str
) -> None:
    whole = ids(client.get("/api/errors", params={"sort": sort}))
    paged = [
        item
        for page in (1, 2, 3)
        for item in ids(
            client.get("/api/errors", params={"sort": sort, "per_page": 3, "page": page})
        )
    ]

    assert paged == whole


def test_default_sort_is_time_sent_descending_empty_last(
    client: TestClient, varied: list[FailedAttempt]
) -> None:
    items = client.get("/api/errors").json()

    assert [item["id"] for item in items] == expected_order(items, "time_sent", True)
    assert "time_sent" not in items[-1] and "time_sent" not in items[-2]


@pytest.mark.parametrize(
    ("name", "value"), [("sort", "time"), ("sort", "TIME_SENT"), ("direction", "up")]
)
def test_an_unknown_sort_or_direction_reads_as_the_default(
    client: TestClient, name: str, value: str
) -> None:
    # docs/decisions.md "List parameters are read leniently, as ServiceControl reads them":
    # ServicePulse sends such values.
    default = client.get("/api/errors").json()
    response = client.get("/api/errors", params={name: value})

    assert response.status_code == 200
    assert response.json() == default


# --- status filter ------------------------------------------------------------------------
@pytest.fixture
def two_of_each_status(engine: sa.Engine, writer: FailedMessageBatchWriter) -> None:
    """Messages 0..7: 0-1 unresolved, 2-3 resolved, 4-5 retry issued, 6-7 archived."""
    writer.write(IngestionBatch(attempts=[attempt(n, at(n)) for n in range(8)]))
    for n in range(8):
        set_rows(engine, n, status=n // 2 + 1)


def messages(*numbers: int) -> set[str]:
    return {message_uuid(n) for n in numbers}


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("unresolved", messages(0, 1)),
        ("resolved", messages(2, 3)),
        ("retryissued", messages(4, 5)),
        ("retryIssued", messages(4, 5)),
        ("archived", messages(6, 7)),
        ("unresolved,archived", messages(0, 1, 6, 7)),
        (" Unresolved , ARCHIVED ", messages(0, 1, 6, 7)),
        ("-archived", messages(0, 1, 2, 3, 4, 5)),
        ("-archived,-resolved", messages(0, 1, 4, 5)),
        ("unresolved,retryIssued,-retryIssued", messages(0, 1)),
        ("", messages(*range(8))),
    ],
)
def test_status_filter_includes_and_excludes(
    client: TestClient, two_of_each_status: None, status: str, expected: set[str]
) -> None:
    response = client.get("/api/errors", params={"status": status})

    assert set(ids(response)) == expected
    assert response.headers["Total-Count"] == str(len(expected))


def test_an_unknown_status_is_ignored(client: TestClient, two_of_each_status: None) -> None:
    # ServiceControl's FilterByStatusWhere ignores what it cannot read.
    response = client.get("/api/errors", params={"status": "unresolved,failing"})

    assert response.status_code == 200
    assert set(ids(response)) == messages(0, 1)


# --- modified range -----------------------------------------------------------------------
@pytest.fixture
def modified_at_five_instants(engine: sa.Engine, writer: FailedMessageBatchWriter) -> list[str]:
    """Messages 0..4 last modified at at(1000 + n), microseconds included."""
    writer.write(IngestionBatch(attempts=[attempt(n, at(n)) for n in range(5)]))
    for n in range(5):
        set_rows(engine, n, last_modified=at(1000 + n + 0.123456))
    return [(at(1000 + n + 0.123456)).strftime("%Y-%m-%dT%H:%M:%S.%fZ") for n in range(5)]


def test_modified_range_bounds_are_inclusive(
    client: TestClient, modified_at_five_instants: list[str]
) -> None:
    times = modified_at_five_instants

    response = client.get("/api/errors", params={"modified": f"{times[1]}...{times[3]}"})

    assert set(ids(response)) == messages(1, 2, 3)
    assert response.headers["Total-Count"] == "3"


def test_modified_range_one_microsecond_inside_excludes_the_bound(
    client: TestClient, modified_at_five_instants: list[str]
) -> None:
    start = at(1001.123457).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    end = at(1003.123455).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    response = client.get("/api/errors", params={"modified": f"{start}...{end}"})

    assert set(ids(response)) == messages(2)


def test_modified_range_reads_offsets_and_open_ends(
    client: TestClient, modified_at_five_instants: list[str]
) -> None:
    in_paris = (at(1001.123456) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%f+01:00")
    naive = at(1003.123456).strftime("%Y-%m-%dT%H:%M:%S.%f")  # no offset: UTC

    assert set(ids(client.get("/api/errors", params={"modified": f"{in_paris}...{naive}"}))) == (
        messages(1, 2, 3)
    )
    assert set(ids(client.get("/api/errors", params={"modified": f"{naive}..."}))) == messages(3, 4)
    assert set(ids(client.get("/api/errors", params={"modified": f"...{in_paris}"}))) == (
        messages(0, 1)
    )
    # A "+" the client did not encode arrives as a space; it still reads as the offset.
    unencoded = client.get(f"/api/errors?modified={in_paris}...{naive}")
    assert set(ids(unencoded)) == messages(1, 2, 3)


@pytest.mark.parametrize(
    "value",
    [
        "2026-01-01T00:00:00Z",
        "yesterday...today",
        "2026-01-01T00:00:00Z..2026-01-02T00:00:00Z",
        "...",
        "2026-02-01T00:00:00Z...2026-01-01T00:00:00Z",
        "2026-13-01T00:00:00Z...2026-12-01T00:00:00Z",
        "0001-01-01T00:00:00+01:00...2026-01-01T00:00:00Z",
    ],
)
def test_a_malformed_modified_range_is_422_naming_the_parameter(
    client: TestClient, value: str
) -> None:
    response = client.get("/api/errors", params={"modified": value})

    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "modified"]


# --- queue address and endpoint -----------------------------------------------------------
@pytest.fixture
def two_endpoints(settings: Settings, writer: FailedMessageBatchWriter) -> dict[str, set[str]]:
    """Three failures in Sales (queue "Sales@SALES-VM01"), two in Billing."""
    failures = [
        failure(settings, f"s{n}", endpoint="Sales", queue="Sales@SALES-VM01", failed_at=at(n))
        for n in range(3)
    ] + [
        failure(settings, f"b{n}", endpoint="Billing", queue="Billing", failed_at=at(n))
        for n in range(2)
    ]
    writer.write(IngestionBatch(attempts=failures))
    by_endpoint: dict[str, set[str]] = {"Sales": set(), "Billing": set()}
    for item in failures:
        by_endpoint[item.receiving_endpoint].add(item.unique_message_id)
    return by_endpoint


def test_queueaddress_filters_by_exact_queue(
    client: TestClient, two_endpoints: dict[str, set[str]]
) -> None:
    sales = client.get("/api/errors", params={"queueaddress": "Sales@SALES-VM01"})
    partial = client.get("/api/errors", params={"queueaddress": "Sales"})

    assert set(ids(sales)) == two_endpoints["Sales"]
    assert sales.headers["Total-Count"] == "3"
    assert ids(partial) == []


def test_endpoint_errors_are_the_receiving_endpoints_with_the_same_parameters(
    client: TestClient, engine: sa.Engine, two_endpoints: dict[str, set[str]]
) -> None:
    sales = client.get("/api/endpoints/Sales/errors", params={"per_page": 2})
    [archived, *_] = sorted(two_endpoints["Sales"])
    with engine.begin() as conn:
        conn.execute(
            sa.update(failed_messages)
            .where(failed_messages.c.id == archived)
            .values(status=int(FailedMessageStatus.ARCHIVED))
        )
    unarchived = client.get("/api/endpoints/Sales/errors", params={"status": "-archived"})

    assert sales.headers["Total-Count"] == "3"
    assert links(sales)["next"] == "endpoints/Sales/errors?per_page=2&page=2"
    assert set(ids(unarchived)) == two_endpoints["Sales"] - {archived}
    assert ids(client.get("/api/endpoints/Nobody/errors")) == []
    assert set(ids(client.get("/api/endpoints/Billing/errors/"))) == two_endpoints["Billing"]


def test_endpoint_link_encodes_the_endpoint_name(
    client: TestClient, settings: Settings, writer: FailedMessageBatchWriter
) -> None:
    writer.write(
        IngestionBatch(
            attempts=[
                failure(settings, f"m{n}", endpoint="Order Saga", failed_at=at(n)) for n in (1, 2)
            ]
        )
    )

    response = client.get("/api/endpoints/Order Saga/errors", params={"per_page": 1})

    assert links(response)["next"] == "endpoints/Order%20Saga/errors?per_page=1&page=2"


def test_nul_in_a_filter_value_is_422_not_an_error(client: TestClient) -> None:
    response = client.get("/api/errors", params={"queueaddress": "Sales\x00"})

    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "queueaddress"]
