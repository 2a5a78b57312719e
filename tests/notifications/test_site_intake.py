"""POST /api/site-notifications on every provider: a site's notifications stored under
its own id, idempotently, an over-long one refused with a reason naming the field, and
only the site's own token may post them, for its own site only."""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import AuthToken, ConfiguredSite, Settings
from controlroom.db.tables import notifications
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.telemetry.widths import NOTIFICATION_BODY_WIDTH
from tests.reconciliation.harness import central_token_of, site_entry

OPERATOR = "operator-token-0123456789abcdef"


def item(**changes: Any) -> dict[str, Any]:
    fields = {
        "notification_id": str(uuid.uuid4()),
        "source_site": "plant-7",
        "channel": "Email",
        "target": "oncall",
        "subject": "Pump 3 stopped",
        "body": "at 08:00",
        "severity": "Error",
    }
    fields.update(changes)
    return fields


def stored(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(notifications)).all())


def test_a_sites_notifications_are_stored_once_and_an_over_long_one_refused(
    client: TestClient, engine: sa.Engine
) -> None:
    good, long = item(), item(subject="s" * 257)
    answer = client.post("/api/site-notifications", json=[good, long, "nonsense"])
    assert answer.status_code == 200
    body = answer.json()
    assert body["accepted"] == [0]
    assert [(r["index"], r["reason"]) for r in body["rejected"]] == [
        (1, "subject: 257 characters; at most 256"),
        (2, "notification: must be a JSON object"),
    ]
    assert body["rejected"][0]["notification_id"] == long["notification_id"]
    again = client.post("/api/site-notifications", json=[good])
    assert again.json()["accepted"] == [0]
    (row,) = stored(engine)
    assert (row.notification_id, row.source, row.status) == (
        good["notification_id"],
        "site:plant-7",
        "Pending",
    )


@pytest.fixture
def secured(tmp_path: Path, database_url: str, engine: sa.Engine) -> Iterator[TestClient]:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        auth_tokens=[AuthToken(name="olga", token=OPERATOR, role="operator")],
        sites=[site_entry("plant-7", "http://127.0.0.1:9")],
    )
    app = create_app(settings, engine, FileSystemBodyStore(tmp_path / "bodies"))
    with TestClient(app) as client:
        yield client


def test_only_the_sites_own_token_posts_for_its_own_site(
    secured: TestClient, engine: sa.Engine
) -> None:
    site = {"Authorization": f"Bearer {central_token_of('plant-7')}"}
    operator = {"Authorization": f"Bearer {OPERATOR}"}
    assert (
        secured.post("/api/site-notifications", json=[item()], headers=operator).status_code == 403
    )
    foreign = secured.post(
        "/api/site-notifications", json=[item(source_site="plant-9")], headers=site
    )
    assert foreign.status_code == 403 and stored(engine) == []
    own = secured.post("/api/site-notifications", json=[item()], headers=site)
    assert own.json()["accepted"] == [0]


def test_a_refused_notification_is_kept_whole_and_listed_apart_from_telemetry(
    client: TestClient,
) -> None:
    subject, target = "é" * 300, "t" * 257
    long_subject, long_target = item(subject=subject), item(target=target)
    answer = client.post("/api/site-notifications", json=[long_subject, long_target, item()])
    assert answer.json()["accepted"] == [2]
    listed = client.get("/api/notifications/rejected").json()["items"]
    assert {(row["source"], row["reason"]) for row in listed} == {
        ("notification:site:plant-7", "subject: 300 characters; at most 256"),
        ("notification:site:plant-7", "target: 257 characters; at most 256"),
    }
    kept = {}
    for row in listed:
        whole = client.get(row["packet_url"])
        assert whole.status_code == 200
        kept[json.loads(whole.content)["notification_id"]] = json.loads(whole.content)
    assert kept[long_subject["notification_id"]] == long_subject  # nothing cut
    assert kept[long_target["notification_id"]]["target"] == target
    assert client.get("/api/site-calls/rejected").json()["items"] == []
    for row in listed:  # no telemetry: re-submitting one as telemetry finds nothing
        assert client.post(f"/api/site-calls/rejected/{row['id']}/resubmit").status_code == 404


def test_an_empty_notification_id_is_refused_as_not_a_guid(
    client: TestClient, engine: sa.Engine
) -> None:
    answer = client.post(
        "/api/site-notifications", json=[item(notification_id=""), item(notification_id="")]
    )
    assert answer.status_code == 200
    body = answer.json()
    assert body["accepted"] == []
    assert [r["reason"] for r in body["rejected"]] == [
        "notification_id: must be a GUID in 'D' format (8-4-4-4-12 hex digits)"
    ] * 2
    assert stored(engine) == []


def test_text_that_is_not_unicode_is_refused_per_item(
    client: TestClient, engine: sa.Engine
) -> None:
    good = item()
    items = [item(notification_id="\ud800"), item(subject="\udc00 sub"), good]
    answer = client.post(  # JSON escapes a lone surrogate as \\udXXX, as a site's client may
        "/api/site-notifications",
        content=json.dumps(items),
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 200
    body = answer.json()
    assert body["accepted"] == [2]
    assert [(r["index"], r["notification_id"]) for r in body["rejected"]] == [
        (0, None),
        (1, body["rejected"][1]["notification_id"]),
    ]
    assert body["rejected"][0]["reason"].startswith("notification_id: ")
    assert body["rejected"][1]["reason"].startswith("subject: ")
    assert [row.notification_id for row in stored(engine)] == [good["notification_id"]]


def test_a_body_over_its_limit_is_refused_naming_it(client: TestClient, engine: sa.Engine) -> None:
    answer = client.post(
        "/api/site-notifications",
        json=[
            item(body="b" * NOTIFICATION_BODY_WIDTH),
            item(body="b" * (NOTIFICATION_BODY_WIDTH + 1)),
        ],
    )
    body = answer.json()
    assert body["accepted"] == [0]
    assert [r["reason"] for r in body["rejected"]] == [
        f"body: {NOTIFICATION_BODY_WIDTH + 1} characters; at most {NOTIFICATION_BODY_WIDTH}"
    ]


def test_a_nul_character_is_refused_on_every_store(client: TestClient, engine: sa.Engine) -> None:
    good = item()
    answer = client.post(
        "/api/site-notifications",
        json=[item(subject="a\x00b"), item(body="body\x00"), item(target="ops\x00"), good],
    )
    assert answer.status_code == 200
    body = answer.json()
    assert body["accepted"] == [3]
    assert [r["reason"] for r in body["rejected"]] == [
        "subject: must not contain a NUL character",
        "body: must not contain a NUL character",
        "target: must not contain a NUL character",
    ]
    assert [row.notification_id for row in stored(engine)] == [good["notification_id"]]


@pytest.fixture
def mailing_site(tmp_path: Path, database_url: str, engine: sa.Engine) -> Iterator[TestClient]:
    site = ConfiguredSite.model_validate(
        site_entry("plant-7", "http://127.0.0.1:9").model_dump()
        | {"recipient_domains": ["plant.example", "Corp.Example"]}
    )
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url, sites=[site])
    app = create_app(settings, engine, FileSystemBodyStore(tmp_path / "bodies"))
    with TestClient(app, headers={"Authorization": f"Bearer {central_token_of('plant-7')}"}) as c:
        yield c


def test_explicit_addresses_in_the_sites_domains_are_stored_and_others_refused_whole(
    mailing_site: TestClient, engine: sa.Engine
) -> None:
    good = item(target="ignored", recipients=["ops@plant.example", "boss@corp.example"])
    bad = [
        item(recipients=["ops@plant.example", "x@evil.example"]),
        item(recipients=["ops@plant.example\r\nBcc: x@plant.example"]),
        item(recipients=[f"u{n}@plant.example" for n in range(51)]),
        item(recipients=[]),
        item(recipients="ops@plant.example"),
        item(recipients=["ops@plant.example", "ops@plant.example"]),
        item(recipients=["x" * 250 + "@plant.example"]),
        item(channel="Webhook", recipients=["ops@plant.example"]),
    ]
    answer = mailing_site.post("/api/site-notifications", json=[good, *bad])
    assert answer.status_code == 200
    body = answer.json()
    assert body["accepted"] == [0], body["rejected"][0]
    reasons = [r["reason"] for r in body["rejected"]]
    assert [r["index"] for r in body["rejected"]] == list(range(1, len(bad) + 1))
    assert all(reason.startswith("recipients: ") for reason in reasons), reasons
    assert "x@evil.example" in reasons[0] and "recipient_domains" in reasons[0]
    (row,) = stored(engine)
    assert json.loads(row.recipients) == ["ops@plant.example", "boss@corp.example"]
    assert row.target == "ops@plant.example, boss@corp.example"
    listed = mailing_site.get("/api/notifications/rejected").json()["items"]
    kept = [json.loads(mailing_site.get(r["packet_url"]).content) for r in listed]
    assert sorted(k["notification_id"] for k in kept) == sorted(b["notification_id"] for b in bad)
    crlf = next(k for k in kept if k["notification_id"] == bad[1]["notification_id"])
    assert crlf == bad[1]  # kept whole, as posted
    shown = mailing_site.get(f"/api/notifications/{good['notification_id']}").json()
    assert shown["recipients"] == ["ops@plant.example", "boss@corp.example"]


@pytest.mark.parametrize(
    "decoded",
    [b"Evil <evil@evil.example>, ", b"x\r\nBcc: x@evil.example", b'"a,b" <z@evil.example>'],
    ids=["display-name", "crlf", "quoted"],
)
def test_an_address_holding_an_encoded_word_is_refused(
    mailing_site: TestClient, engine: sa.Engine, decoded: bytes
) -> None:
    # The e-mail package decodes an encoded word even in a local part, so the To header
    # would name an address of a domain the site may not mail (RFC 2047 5: never in an
    # addr-spec).
    word = "=?utf-8?b?" + base64.b64encode(decoded).decode() + "?="
    answer = mailing_site.post(
        "/api/site-notifications", json=[item(recipients=[f"{word}@plant.example"])]
    )
    (refused,) = answer.json()["rejected"]
    assert refused["reason"].startswith("recipients: ")
    assert stored(engine) == []


def test_a_site_central_does_not_list_may_not_name_addresses(
    client: TestClient, engine: sa.Engine
) -> None:
    """Its reason says the site has no entry (fresh-user pass, sixth: it named the entry's
    ``recipient_domains``, which the operator looked for in vain)."""
    answer = client.post("/api/site-notifications", json=[item(recipients=["a@plant.example"])])
    (refused,) = answer.json()["rejected"]
    assert refused["reason"] == (
        "recipients: a@plant.example: site plant-7 is not in central's sites, so it may "
        "mail no address of its own (an entry's recipient_domains)"
    )
    assert stored(engine) == []


def test_a_target_central_does_not_know_is_taken_and_left_to_the_dispatcher(
    client: TestClient, engine: sa.Engine
) -> None:
    unknown = [item(target="no-such-list"), item(channel="Webhook", target="no-such-hook")]
    answer = client.post("/api/site-notifications", json=unknown)
    assert answer.json() == {"accepted": [0, 1], "rejected": []}
    assert sorted((r.target, r.status) for r in stored(engine)) == [
        ("no-such-hook", "Pending"),
        ("no-such-list", "Pending"),
    ]


def test_a_refused_notification_is_kept_as_the_bytes_sent(client: TestClient) -> None:
    sent = json.dumps(item(subject="s" * 257))[:-1].encode() + b', "x": 1e400 , "x": 2}'
    body = b"[ " + sent + b"\n]"

    answer = client.post(
        "/api/site-notifications", content=body, headers={"content-type": "application/json"}
    )

    assert answer.json()["rejected"][0]["index"] == 0, answer.text
    (kept,) = client.get("/api/notifications/rejected").json()["items"]
    assert client.get(kept["packet_url"]).content == sent


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"subject": ""}, "subject: must not be empty"),
        ({"surprise": 1}, "surprise: not a field of a site's notification"),
        ({"source_site": ""}, "source_site: must not be empty"),
        ({"source_site": "s" * 65}, "source_site: 65 characters; at most 64"),
        # The name is the sender's text: kept and answered as escapes, as telemetry's are.
        ({"a\x00\ud800": 1}, "a\\x00\\ud800: not a field of a site's notification"),
    ],
)
def test_central_refuses_what_the_site_agent_refuses_naming_the_field(
    client: TestClient, engine: sa.Engine, changes: dict[str, Any], reason: str
) -> None:
    # The agent's contract (telemetry.notification) refuses both; a site that posts
    # directly must not get past central with them.
    body = json.dumps([item(**changes)])  # ASCII: a lone surrogate as its escape
    answer = client.post(
        "/api/site-notifications", content=body, headers={"content-type": "application/json"}
    )

    assert [r["reason"] for r in answer.json()["rejected"]] == [reason], answer.text
    assert stored(engine) == []
    (kept,) = client.get("/api/notifications/rejected").json()["items"]
    assert kept["reason"] == reason


@pytest.mark.parametrize("site", ["plant\ud800", "plant\x00", ""])
def test_a_refused_notification_naming_an_unstorable_site_is_kept_and_answered(
    client: TestClient, site: str
) -> None:
    # The site's name labels the kept item: a label the store cannot hold must not turn
    # the whole request into a 500 (the good item beside it is stored).
    body = json.dumps([item(source_site=site), item()])
    answer = client.post(
        "/api/site-notifications", content=body, headers={"content-type": "application/json"}
    )

    assert answer.status_code == 200, answer.text
    assert answer.json()["accepted"] == [1]
    (kept,) = client.get("/api/notifications/rejected").json()["items"]
    assert kept["packet"] == body[1 : body.index("}, {") + 1]


def test_a_notification_id_in_upper_case_names_the_same_notification(
    client: TestClient, engine: sa.Engine
) -> None:
    # The contract reads a GUID in any case, as telemetry's and the API's paths do.
    given = str(uuid.uuid4())

    upper = client.post("/api/site-notifications", json=[item(notification_id=given.upper())])
    lower = client.post("/api/site-notifications", json=[item(notification_id=given)])

    assert upper.json() == lower.json() == {"accepted": [0], "rejected": []}
    assert [row.notification_id for row in stored(engine)] == [given]


def test_every_field_at_fault_is_named(client: TestClient, engine: sa.Engine) -> None:
    answer = client.post(
        "/api/site-notifications", json=[item(subject="s" * 257, channel="Pager", severity=3)]
    )

    (refused,) = answer.json()["rejected"]
    named = re.findall(r"(?:^|; )(\w+): ", refused["reason"])
    assert named == ["channel", "subject", "severity"], refused["reason"]
    assert stored(engine) == []


def test_a_refused_notification_downloads_from_the_notifications_own_path(
    client: TestClient,
) -> None:
    # Listed under /api/notifications/rejected, it is no telemetry: its download is there
    # too, and that path serves no rejected telemetry.
    client.post("/api/site-notifications", json=[item(subject="")])
    client.post("/api/site-calls/telemetry", json=[{"surprise": 1}])
    (kept,) = client.get("/api/notifications/rejected").json()["items"]
    (telemetry,) = client.get("/api/site-calls/rejected").json()["items"]

    assert kept["packet_url"] == f"/api/notifications/rejected/{kept['id']}/packet"
    assert json.loads(client.get(kept["packet_url"]).content)["subject"] == ""
    foreign = client.get(f"/api/notifications/rejected/{telemetry['id']}/packet")
    assert foreign.status_code == 404, foreign.text


def test_the_same_bytes_refused_as_telemetry_and_as_a_notification_are_kept_as_both(
    client: TestClient,
) -> None:
    body = b'[{"source_site": "plant-7", "a": 1}]'
    headers = {"content-type": "application/json"}

    client.post("/api/site-notifications", content=body, headers=headers)
    client.post("/api/site-calls/telemetry", content=body, headers=headers)

    (notification,) = client.get("/api/notifications/rejected").json()["items"]
    (telemetry,) = client.get("/api/site-calls/rejected").json()["items"]
    assert notification["id"] != telemetry["id"]
    assert "notification" in notification["reason"] and "telemetry" in telemetry["reason"]
