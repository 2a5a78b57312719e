"""The site-call API over each provider: telemetry intake, lists with keyset paging, one
call with its audit events, KPIs, history, rejected packets (docs/design.md "Site call
audit")."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.sitecalls.history import take_sample
from controlroom.sitecalls.writer import SiteCallWriter
from controlroom.telemetry.stamps import Stamp
from tests.sitecalls.packets import T0, packet, write


def all_pages(
    client: TestClient, path: str, limit: int, **params: Any
) -> list[list[dict[str, Any]]]:
    pages, after = [], None
    while True:
        query = {**params, "limit": limit, **({"after": after} if after else {})}
        answer = client.get(path, params=query)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        pages.append(body["items"])
        after = body["next_cursor"]
        if after is None:
            return pages


def test_post_telemetry_answers_accepted_and_rejected(client: TestClient) -> None:
    op_id = str(uuid.uuid4())
    event_id = str(uuid.uuid4())
    answer = client.post(
        "/api/site-calls/telemetry",
        json=[
            packet("Submitted", op_id=op_id, event_id=event_id),
            packet("Submitted", op_id=str(uuid.uuid4()), source_site="s" * 65),
            "not a packet",
            packet("Forwarded", op_id=op_id, at=T0 + timedelta(seconds=1), surprise=1),
        ],
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["accepted"] == [0]
    reasons = {item["index"]: item["reason"] for item in body["rejected"]}
    assert reasons[1].startswith("source_site:")
    assert "JSON object" in reasons[2]
    assert reasons[3].startswith("surprise:")

    details = client.get(f"/api/site-calls/{op_id.upper()}").json()
    assert details["status"] == "Submitted"
    assert [event["event_id"] for event in details["audit_events"]] == [event_id]

    rejected = client.get("/api/site-calls/rejected").json()["items"]
    assert len(rejected) == 3
    assert any("s" * 65 in item["packet"] for item in rejected)


def test_a_request_of_more_packets_than_one_may_hold_is_413_and_writes_none(
    client: TestClient,
) -> None:
    """README "Site call audit": at most 1,000 packets per request."""
    ids = [str(uuid.UUID(int=n + 1)) for n in range(1001)]
    answer = client.post(
        "/api/site-calls/telemetry", json=[packet("Submitted", op_id=i) for i in ids]
    )
    assert answer.status_code == 413, answer.text
    assert "at most 1000 packets" in answer.json()["detail"]
    assert client.get(f"/api/site-calls/{ids[0]}").status_code == 404

    answer = client.post(
        "/api/site-calls/telemetry", json=[packet("Submitted", op_id=i) for i in ids[:1000]]
    )
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["accepted"]) == 1000


def forged(*values: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


def refused_cursor(answer: Any) -> None:
    """A cursor the list did not hand out is a bad parameter: a 422 naming ``after``
    (README "Reading"; fresh-user pass, seventh: it was a 400)."""
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["detail"]
    assert error["loc"] == ["query", "after"], answer.text


def test_unknown_site_call_is_404_and_a_bad_cursor_422(client: TestClient) -> None:
    assert client.get(f"/api/site-calls/{uuid.uuid4()}").status_code == 404
    refused_cursor(client.get("/api/audit-log", params={"after": "garbage"}))
    refused_cursor(client.get("/api/site-calls/rejected", params={"after": "garbage"}))
    instant = "2026-12-01T01:00:00+00:00"
    for cursor in (
        forged(instant, str(uuid.uuid4())),  # a cursor of before the ticks
        forged(instant, 10**12, str(uuid.uuid4())),  # ticks no column holds
        forged(instant, True, str(uuid.uuid4())),
        forged(instant, 3, 7),
    ):
        refused_cursor(client.get("/api/site-calls", params={"after": cursor}))
    assert client.get("/api/site-calls/kpis", params={"node": "n"}).status_code == 400


def test_audit_log_keyset_paging_with_one_shared_instant(
    client: TestClient, engine: sa.Engine
) -> None:
    # 23 events at one occurred_at_utc, 4 at another: pages of 5 must cover each once.
    writer = SiteCallWriter(engine)
    shared, other = T0 + timedelta(minutes=5), T0 + timedelta(minutes=1)
    events = []
    for n in range(27):
        event_id = str(uuid.uuid4())
        events.append(event_id)
        data = packet("Submitted", op_id=str(uuid.uuid4()), event_id=event_id)
        data["audit_event"]["occurred_at_utc"] = (shared if n < 23 else other).isoformat()
        write(writer, data)
    pages = all_pages(client, "/api/audit-log", 5)
    seen = [item["event_id"] for page in pages for item in page]
    assert len(seen) == len(set(seen)) == 27  # no overlap
    assert set(seen) == set(events)  # no gap
    assert [len(page) for page in pages] == [5, 5, 5, 5, 5, 2]
    # newest first, ties by event_id descending
    keys = [(item["occurred_at_utc"], item["event_id"]) for page in pages for item in page]
    assert keys == sorted(keys, reverse=True)


@pytest.mark.parametrize(
    ("path", "stamp", "key"),
    [
        ("/api/site-calls", "created_at_utc", "tracked_operation_id"),
        ("/api/audit-log", "occurred_at_utc", "event_id"),
        ("/api/site-calls?site=brkns", "created_at_utc", "tracked_operation_id"),
    ],
)
def test_the_lists_order_and_page_by_the_whole_stamp_to_100_ns(
    client: TestClient, path: str, stamp: str, key: str
) -> None:
    """Breaker pass (sixth): ten calls created 100 ns apart within one microsecond came
    newest-first in the order of their ids; the cursor held the microsecond only. Each
    list orders by the stamp as the site sent it (docs/design.md "Stamps"), ids only
    breaking ties of the whole stamp."""
    sent = []
    for digit in (6, 2, 9, 1, 4, 5, 0, 7, 3, 8):
        at = f"2026-12-01T01:00:00.123456{digit}Z"
        data = packet(
            "Submitted",
            op_id=str(uuid.uuid4()),
            event_id=str(uuid.uuid4()),
            created_at_utc=at,
            updated_at_utc=at,
            source_site="brkns",
        )
        data["audit_event"]["occurred_at_utc"] = at
        sent.append(data)
    assert client.post("/api/site-calls/telemetry", json=sent).json()["accepted"] == list(range(10))

    pages = all_pages(client, path, 1)

    stamps = [page[0][stamp] for page in pages]
    assert stamps == [f"2026-12-01T01:00:00.123456{digit}Z" for digit in range(9, -1, -1)]
    assert len({page[0][key] for page in pages}) == 10


def test_site_call_list_filters_and_pages(client: TestClient, engine: sa.Engine) -> None:
    writer = SiteCallWriter(engine)
    for n in range(12):
        write(
            writer,
            packet(
                "Delivered" if n % 3 == 0 else "Attempted",
                op_id=str(uuid.uuid4()),
                at=T0 + timedelta(minutes=n),
                source_site="site-a" if n % 2 else "site-b",
            ),
        )
    pages = all_pages(client, "/api/site-calls", 4, site="site-a")
    items = [item for page in pages for item in page]
    assert len(items) == 6 and {item["source_site"] for item in items} == {"site-a"}
    delivered = client.get("/api/site-calls", params={"status": "Delivered"}).json()["items"]
    assert len(delivered) == 4


def test_kpis_and_history_over_http(
    client: TestClient, engine: sa.Engine, settings: Settings
) -> None:
    client.post("/api/site-calls/telemetry", json=[packet("Parked", op_id=str(uuid.uuid4()))])
    kpis = client.get("/api/site-calls/kpis", params={"site": "site-a"}).json()
    assert (kpis["scope"], kpis["scope_key"], kpis["parked"]) == ("site", "site-a", 1)
    take_sample(engine, settings, T0)
    series = client.get(
        "/api/kpi-history",
        params={
            "metric": "parked",
            "scope": "node",
            "scope_key": "site-a/node-1",
            "from": (T0 - timedelta(hours=1)).isoformat(),
            "to": (T0 + timedelta(hours=1)).isoformat(),
        },
    ).json()
    assert [(p["value"], p["samples"]) for p in series["points"]] == [(1.0, 1)]


def test_packets_no_store_can_hold_are_rejected_by_name_beside_accepted_ones(
    client: TestClient,
) -> None:
    deep = packet("Attempted", op_id=str(uuid.uuid4()), event_id=str(uuid.uuid4()))
    deep["audit_event"]["details_json"] = "[" * 5000
    late = packet("Attempted", op_id=str(uuid.uuid4()), updated_at_utc="9999-12-31T23:59:59-01:00")
    early_event = packet("Attempted", op_id=str(uuid.uuid4()), event_id=str(uuid.uuid4()))
    early_event["audit_event"]["occurred_at_utc"] = "0001-01-01T00:00:00+05:00"
    good = packet("Attempted", op_id=str(uuid.uuid4()))
    answer = client.post("/api/site-calls/telemetry", json=[late, good, deep, early_event])
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["accepted"] == [1]
    reasons = {item["index"]: item["reason"] for item in body["rejected"]}
    assert reasons[0].startswith("updated_at_utc:")
    assert reasons[2].startswith("audit_event.details_json:")
    assert reasons[3].startswith("audit_event.occurred_at_utc:")
    kept = client.get("/api/site-calls/rejected").json()["items"]
    # Kept whole: the list shows each packet's beginning, its download the whole of it.
    wholes = [client.get(item["packet_url"]).content for item in kept]
    assert any(b"[" * 5000 in whole for whole in wholes)
    assert client.get(f"/api/site-calls/{good['tracked_operation_id']}").status_code == 200


FIRST_DAY_EAST = "0001-01-01T00:00:00+05:00"  # before year 1 in UTC
LAST_DAY_WEST = "9999-12-31T23:59:59-00:01"  # after year 9999 in UTC


def forged_cursor(instant: str) -> str:
    text = json.dumps([instant, "3f2b8c4e-5d1a-4e7b-9c60-2a8f1d3e4b5c"])
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("path", "params", "named"),
    [
        ("/api/site-calls", {"created_from": FIRST_DAY_EAST}, "created_from"),
        ("/api/site-calls", {"created_to": LAST_DAY_WEST}, "created_to"),
        ("/api/audit-log", {"occurred_from": FIRST_DAY_EAST}, "occurred_from"),
        ("/api/audit-log", {"occurred_to": LAST_DAY_WEST}, "occurred_to"),
        ("/api/kpi-history", {"metric": "buffered", "from": FIRST_DAY_EAST}, "from"),
        ("/api/kpi-history", {"metric": "buffered", "to": LAST_DAY_WEST}, "to"),
        ("/api/site-calls", {"after": forged_cursor(LAST_DAY_WEST)}, "after"),
        ("/api/audit-log", {"after": forged_cursor(FIRST_DAY_EAST)}, "after"),
        ("/api/site-calls/rejected", {"after": forged_cursor(LAST_DAY_WEST)}, "after"),
    ],
)
def test_a_time_outside_the_utc_range_is_a_4xx_naming_the_parameter(
    client: TestClient, path: str, params: dict[str, str], named: str
) -> None:
    seeded = [packet("Attempted", event_id=str(uuid.uuid4())), "not a packet"]
    assert client.post("/api/site-calls/telemetry", json=seeded).status_code == 200
    answer = client.get(path, params=params)
    assert 400 <= answer.status_code < 500, answer.text
    assert named in answer.text


def test_a_packet_naming_another_site_than_its_call_is_rejected_whole(
    client: TestClient,
) -> None:
    # Any operator token may post telemetry; it must not take over another site's call.
    known, fresh = str(uuid.uuid4()), str(uuid.uuid4())
    first = client.post("/api/site-calls/telemetry", json=[packet("Attempted", op_id=known)])
    assert first.json()["accepted"] == [0]
    takeover = packet(
        "Parked", op_id=known, epoch=2**31 - 1, source_site="intruder", event_id=str(uuid.uuid4())
    )
    answer = client.post(
        "/api/site-calls/telemetry",
        json=[
            takeover,
            packet("Submitted", op_id=fresh),
            packet("Parked", op_id=fresh, epoch=5, source_site="intruder"),
        ],
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["accepted"] == [1]
    reasons = {item["index"]: item["reason"] for item in body["rejected"]}
    assert set(reasons) == {0, 2}
    assert all(reason.startswith("source_site:") for reason in reasons.values())
    assert "site-a" in reasons[0]
    for op_id, status in ((known, "Attempted"), (fresh, "Submitted")):
        details = client.get(f"/api/site-calls/{op_id}").json()
        assert (details["source_site"], details["status"], details["epoch"]) == (
            "site-a",
            status,
            0,
        )
    assert client.get(f"/api/site-calls/{known}").json()["audit_events"] == []
    kept = client.get("/api/site-calls/rejected").json()["items"]
    assert sum("intruder" in item["packet"] for item in kept) == 2


def test_an_audit_correlation_id_must_be_a_guid(client: TestClient) -> None:
    data = packet("Attempted", op_id=str(uuid.uuid4()), event_id=str(uuid.uuid4()))
    data["audit_event"]["correlation_id"] = "' OR 1=1 --"
    answer = client.post("/api/site-calls/telemetry", json=[data])
    (rejected,) = answer.json()["rejected"]
    assert rejected["reason"].startswith("audit_event.correlation_id:")


def test_a_refused_body_is_named_never_echoed(client: TestClient) -> None:
    # The value holds an unpaired surrogate: echoing it back could not even be encoded.
    answer = client.post(
        "/api/site-calls/telemetry",
        content=b'{"\\ud800": "\\udfff"}',
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["body"]
    assert "input" not in answer.json()["detail"][0]


@pytest.mark.parametrize(("name", "value"), [("status", "Parked\x00"), ("channel", "Smoke")])
def test_an_unknown_status_or_channel_filter_is_a_422_naming_it(
    client: TestClient, name: str, value: str
) -> None:
    answer = client.get("/api/site-calls", params={name: value})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["query", name]
    assert client.get("/api/site-calls", params={"status": "Parked"}).status_code == 200


@pytest.mark.parametrize("name", ["site", "status", "channel", "target"])
def test_a_filter_given_twice_is_a_400_naming_it(client: TestClient, name: str) -> None:
    values = {"site": "plant-7", "status": "Parked", "channel": "ApiOutbound", "target": "t"}
    answer = client.get(f"/api/site-calls?{name}={values[name]}&{name}={values[name]}")
    assert answer.status_code == 400, answer.text
    assert answer.json()["detail"] == f"{name}: give it at most once"


def test_a_reason_quoting_an_unstorable_field_name_is_kept_and_answered(
    client: TestClient,
) -> None:
    # The unknown field's name is the sender's text: a NUL or an unpaired surrogate in it
    # must not stop the packet being kept, nor the answer being rendered.
    bad = {**packet("Attempted", op_id=str(uuid.uuid4())), "a\x00": 1}
    body = json.dumps([bad, packet("Attempted", op_id=str(uuid.uuid4()))])
    answer = client.post(
        "/api/site-calls/telemetry",
        content=body.encode(),
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["accepted"] == [1]
    (rejected,) = answer.json()["rejected"]
    assert rejected["reason"].startswith("a\\x00")
    (kept,) = client.get("/api/site-calls/rejected").json()["items"]
    assert kept["reason"] == rejected["reason"]


def test_a_packet_whose_id_is_a_lone_surrogate_is_rejected_and_answered_once(
    client: TestClient,
) -> None:
    """Breaker pass (fifth): the answer echoing the id could not be encoded: a 500 after
    the packet was kept, so a client retrying on 500 added a row per try."""
    bad = {**packet("Attempted", op_id=str(uuid.uuid4())), "tracked_operation_id": "\ud800"}
    answer = client.post(
        "/api/site-calls/telemetry",
        content=json.dumps([bad]).encode(),
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 200, answer.text
    (rejected,) = answer.json()["rejected"]
    assert rejected["tracked_operation_id"] is None  # no text to echo
    assert "tracked_operation_id" in rejected["reason"]
    assert len(client.get("/api/site-calls/rejected").json()["items"]) == 1


@pytest.mark.parametrize("action", ["retry", "discard"])
def test_an_action_names_the_call_by_its_guid_in_any_case(client: TestClient, action: str) -> None:
    # Telemetry and the call's page read the GUID in any case; the actions must too.
    op_id = str(uuid.uuid4())
    client.post("/api/site-calls/telemetry", json=[packet("Parked", op_id=op_id)])

    lower = client.post(f"/api/site-calls/{op_id}/{action}")
    upper = client.post(f"/api/site-calls/{op_id.upper()}/{action}")

    assert lower.status_code != 404, lower.text
    assert (upper.status_code, upper.json()) == (lower.status_code, lower.json())


@pytest.mark.parametrize("action", ["retry", "discard"])
def test_an_action_on_an_id_that_is_no_guid_is_a_422_naming_it(
    client: TestClient, action: str
) -> None:
    answer = client.post(f"/api/site-calls/not-a-guid/{action}")

    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["path", "tracked_operation_id"]


def test_a_rejected_packet_is_kept_as_the_bytes_sent(client: TestClient) -> None:
    # Key order, spacing, a duplicate key, a number JSON cannot round-trip: all as sent.
    first = (
        f'{{ "tracked_operation_id" : "{uuid.uuid4()}", "retry_count": 1.00000000000000000001,'
        ' "http_status": 1e400, "note": "dup", "note": "second" }'
    ).encode()
    second = '{"source_site": "é", "surprise": [1 ,2]}'.encode()
    body = b"[\n  " + first + b" ,\r\n\t" + second + b"\n]"

    answer = client.post(
        "/api/site-calls/telemetry", content=body, headers={"content-type": "application/json"}
    )

    assert answer.status_code == 200, answer.text
    assert [item["index"] for item in answer.json()["rejected"]] == [0, 1]
    kept = [item["packet_url"] for item in client.get("/api/site-calls/rejected").json()["items"]]
    assert sorted(client.get(url).content for url in kept) == sorted([first, second])


def test_a_telemetry_body_that_is_not_utf8_json_is_refused_naming_the_body(
    client: TestClient,
) -> None:
    body = json.dumps([packet("Submitted", op_id=str(uuid.uuid4()))]).encode("utf-16")

    answer = client.post(
        "/api/site-calls/telemetry", content=body, headers={"content-type": "application/json"}
    )

    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["body"]
    assert client.get("/api/site-calls").json()["items"] == []


STAMP = "2026-11-01T09:14:03.1200005Z"
BOUNDS = [  # (parameter, bound, rows): from inclusive, to exclusive, to 100 ns
    ("from", "2026-11-01T09:14:03.1200005Z", 1),
    ("from", "2026-11-01T09:14:03.1200006Z", 0),
    ("to", "2026-11-01T09:14:03.1200006Z", 1),
    ("to", "2026-11-01T09:14:03.1200005Z", 0),
    ("to", "2026-11-01T09:14:03.120001Z", 1),
]


@pytest.mark.parametrize(("bound", "value", "rows"), BOUNDS)
def test_a_site_calls_created_range_reads_its_bounds_to_100_ns(
    client: TestClient, bound: str, value: str, rows: int
) -> None:
    op_id = str(uuid.uuid4())
    sent = packet("Submitted", op_id=op_id, target="T", created_at_utc=STAMP, updated_at_utc=STAMP)
    assert client.post("/api/site-calls/telemetry", json=[sent]).json()["accepted"] == [0]

    answer = client.get("/api/site-calls", params={"target": "T", f"created_{bound}": value})

    assert answer.status_code == 200, answer.text
    assert len(answer.json()["items"]) == rows


@pytest.mark.parametrize(("bound", "value", "rows"), BOUNDS)
def test_the_audit_logs_occurred_range_reads_its_bounds_to_100_ns(
    client: TestClient, bound: str, value: str, rows: int
) -> None:
    sent = packet(
        "Submitted", op_id=str(uuid.uuid4()), at=Stamp.parse(STAMP), event_id=str(uuid.uuid4())
    )
    assert client.post("/api/site-calls/telemetry", json=[sent]).json()["accepted"] == [0]

    answer = client.get("/api/audit-log", params={f"occurred_{bound}": value})

    assert answer.status_code == 200, answer.text
    assert len(answer.json()["items"]) == rows


@pytest.mark.parametrize("name", ["created_from", "created_to"])
def test_a_range_bound_past_100_ns_is_a_422_naming_it(client: TestClient, name: str) -> None:
    answer = client.get("/api/site-calls", params={name: "2026-11-01T09:14:03.12000051Z"})

    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["query", name]


SCOPES = [  # (route, scope and key, whether the key fits the scope)
    ("/api/kpi-history", {"scope": "global", "scope_key": "north"}, False),
    ("/api/kpi-history", {"scope": "site"}, False),
    ("/api/kpi-history", {"scope": "node", "scope_key": "north"}, False),
    ("/api/kpi-history", {"scope": "node", "scope_key": "north/"}, False),
    ("/api/notifications/kpi-history", {"scope": "global", "scope_key": "Email"}, False),
    ("/api/notifications/kpi-history", {"scope": "channel"}, False),
    ("/api/notifications/kpi-history", {"scope": "channel", "scope_key": "Pager"}, False),
    ("/api/kpi-history", {"scope": "global"}, True),
    ("/api/kpi-history", {"scope": "site", "scope_key": "north"}, True),
    ("/api/kpi-history", {"scope": "node", "scope_key": "north/n1"}, True),
    ("/api/notifications/kpi-history", {"scope": "channel", "scope_key": "Email"}, True),
]


@pytest.mark.parametrize(("path", "params", "fits"), SCOPES)
def test_a_kpi_history_scope_key_that_does_not_fit_its_scope_is_a_422_naming_it(
    client: TestClient, path: str, params: dict[str, str], fits: bool
) -> None:
    # An empty series for a key no sample can have would read as "nothing happened".
    answer = client.get(path, params={"metric": "parked", **params})

    if fits:
        assert answer.status_code == 200, answer.text
    else:
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"][0]["loc"] == ["query", "scope_key"]


def test_an_audit_event_in_the_last_month_the_contract_allows_is_written(
    client: TestClient,
) -> None:
    # December 9999 has no next month to bound its chain's month by.
    last = Stamp.parse("9999-12-31T23:59:59.9999999Z")
    sent = [
        packet("Submitted", op_id=str(uuid.uuid4()), at=last, event_id=str(uuid.uuid4()))
        for _ in range(2)
    ]

    answer = client.post("/api/site-calls/telemetry", json=sent)

    assert answer.status_code == 200, answer.text
    assert answer.json()["accepted"] == [0, 1]
    assert len(client.get("/api/audit-log").json()["items"]) == 2


@pytest.mark.parametrize("route", ["/api/site-calls/telemetry", "/api/site-notifications"])
@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"[\xff]", "application/json"),  # not UTF-8
        (b"[] x", "application/json"),  # more after the array
        (b"[NaN]", "application/json"),
        ("[]".encode("utf-16"), "application/json"),
        (b"{}", "application/json"),
        (b"", "application/json"),
        (b"[]", "text/plain"),
    ],
    ids=["not-utf8", "trailing", "nan", "utf16", "object", "empty", "text-plain"],
)
def test_a_body_that_is_not_one_json_array_is_one_422_naming_the_body(
    client: TestClient, route: str, body: bytes, content_type: str
) -> None:
    # Both routes read their body once, as the bytes sent: every way of not being one
    # UTF-8 JSON array is the same refusal, whoever would have decoded it.
    answer = client.post(route, content=body, headers={"content-type": content_type})

    assert answer.status_code == 422, answer.text
    (problem,) = answer.json()["detail"]
    assert problem["loc"] == ["body"], problem
    assert "input" not in problem


@pytest.mark.parametrize("path", ["/api/kpi-history", "/api/notifications/kpi-history"])
@pytest.mark.parametrize("bound", ["from", "to"])
def test_a_kpi_history_bound_of_more_than_seven_fractional_digits_is_a_422_naming_it(
    client: TestClient, path: str, bound: str
) -> None:
    # Every time parameter reads as the stamps do: to 100 ns, never cut silently.
    answer = client.get(
        path, params={"metric": "parked", "scope": "global", bound: "2026-11-01T09:14:03.12345678Z"}
    )

    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["query", bound]


@pytest.mark.parametrize("path", ["/api/kpi-history", "/api/notifications/kpi-history"])
def test_a_kpi_history_ending_in_the_first_day_answers_from_the_first_instant(
    client: TestClient, path: str
) -> None:
    # Its default start, a day before, would fall in year 0.
    answer = client.get(
        path, params={"metric": "parked", "scope": "global", "to": "0001-01-01T12:00:00Z"}
    )

    assert answer.status_code == 200, answer.text
    assert answer.json()["from_utc"] == "0001-01-01T00:00:00.0000000Z"
    assert answer.json()["points"] == []


@pytest.mark.parametrize("route", ["/api/site-calls/telemetry", "/api/site-notifications"])
def test_a_body_nested_too_deeply_is_a_422_naming_the_body(client: TestClient, route: str) -> None:
    deep = b"[" + b"[" * 5000 + b"]" * 5000 + b"]"

    answer = client.post(route, content=deep, headers={"content-type": "application/json"})

    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["body"]


SAMPLED = datetime(2026, 11, 1, 9, 14, 3, 618697, tzinfo=UTC)
"""A sample's time: central keeps its own times to the microsecond."""


@pytest.mark.parametrize(
    ("bound", "value", "kept"),
    [
        ("from", "2026-11-01T09:14:03.6186970Z", True),
        ("from", "2026-11-01T09:14:03.6186971Z", False),  # 100 ns after the sample
        ("to", "2026-11-01T09:14:03.6186970Z", True),
        ("to", "2026-11-01T09:14:03.6186969Z", False),
    ],
)
def test_a_kpi_history_bound_is_read_to_100_ns_and_answered_as_given(
    client: TestClient, engine: sa.Engine, bound: str, value: str, kept: bool
) -> None:
    from controlroom.config import Settings
    from controlroom.sitecalls.history import take_sample

    take_sample(engine, Settings(), SAMPLED)
    other = "to" if bound == "from" else "from"
    around = {"from": "2026-11-01T00:00:00Z", "to": "2026-11-02T00:00:00Z"}[other]

    answer = client.get(
        "/api/kpi-history",
        params={"metric": "buffered", "scope": "global", bound: value, other: around},
    )

    assert answer.status_code == 200, answer.text
    assert answer.json()[f"{bound}_utc"] == value
    assert len(answer.json()["points"]) == (1 if kept else 0)
