"""Stamps to 100 ns, exactly as sent (docs/design.md "Stamps"), on every provider: the
newer of two packets 100 ns apart wins, the API answers both stamps to the 100 ns, and a
stamp finer than 100 ns is refused naming its field."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.sitecalls.writer import SiteCallWriter
from controlroom.telemetry.stamps import Stamp
from tests.sitecalls.packets import packet, stored, write

OLDER = "2026-01-01T08:30:00.1234568Z"
NEWER = "2026-01-01T08:30:00.1234569Z"  # 100 ns later, the same microsecond


@pytest.mark.parametrize("order", ["older first", "newer first", "one batch"])
def test_of_two_packets_100_ns_apart_the_newer_wins(engine: sa.Engine, order: str) -> None:
    op_id = str(uuid.uuid4())
    older = packet("Attempted", op_id=op_id, at=Stamp.parse(OLDER), retry_count=1)
    newer = packet("Attempted", op_id=op_id, at=Stamp.parse(NEWER), retry_count=2)
    writer = SiteCallWriter(engine)
    if order == "one batch":
        assert write(writer, newer, older) == [None, None]
    else:
        for item in (older, newer) if order == "older first" else (newer, older):
            assert write(writer, item) == [None]
    row = stored(engine, op_id)
    assert row.retry_count == 2
    assert (row.updated_at_utc, row.updated_at_tick) == (Stamp.parse(NEWER).instant, 9)


def test_the_api_answers_stamps_to_100_ns(client: TestClient) -> None:
    op_id = str(uuid.uuid4())
    events = [str(uuid.uuid4()), str(uuid.uuid4())]
    answer = client.post(
        "/api/site-calls/telemetry",
        json=[
            packet("Attempted", op_id=op_id, at=Stamp.parse(at), retry_count=n, event_id=event)
            for n, (at, event) in enumerate(zip((OLDER, NEWER), events, strict=True))
        ],
    )
    assert answer.json() == {"accepted": [0, 1], "rejected": []}

    details = client.get(f"/api/site-calls/{op_id}").json()
    assert (details["updated_at_utc"], details["retry_count"]) == (NEWER, 1)
    assert [e["occurred_at_utc"] for e in details["audit_events"]] == [OLDER, NEWER]
    (listed,) = client.get("/api/site-calls").json()["items"]
    assert listed["updated_at_utc"] == NEWER
    audit = client.get("/api/audit-log", params={"correlation_id": op_id}).json()["items"]
    assert sorted(e["occurred_at_utc"] for e in audit) == [OLDER, NEWER]


def test_a_microsecond_site_is_answered_in_the_same_format(client: TestClient) -> None:
    op_id = str(uuid.uuid4())
    sent = packet("Submitted", op_id=op_id)
    sent["updated_at_utc"] = "2026-01-01T09:30:00.123456+01:00"
    assert client.post("/api/site-calls/telemetry", json=[sent]).json()["rejected"] == []
    details = client.get(f"/api/site-calls/{op_id}").json()
    assert details["updated_at_utc"] == "2026-01-01T08:30:00.1234560Z"


@pytest.mark.parametrize(
    "field", ["updated_at_utc", "created_at_utc", "audit_event.occurred_at_utc"]
)
def test_a_stamp_finer_than_100_ns_is_refused_naming_its_field(
    engine: sa.Engine, field: str
) -> None:
    op_id = str(uuid.uuid4())
    data = packet("Submitted", op_id=op_id, event_id=str(uuid.uuid4()))
    owner = data["audit_event"] if field.startswith("audit_event.") else data
    owner[field.rsplit(".", 1)[-1]] = "2026-01-01T08:30:00.12345691Z"
    (reason,) = write(SiteCallWriter(engine), data)
    assert reason is not None and reason.startswith(f"{field}:")
    assert "7 fractional digits" in reason
    assert stored(engine, op_id) is None
