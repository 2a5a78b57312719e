"""Archive, unarchive and resolve on every provider: status, ``status_changed_at``,
``last_modified``, per-status counts, unknown ids reported, transitions narrowed."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_retries,
    failed_messages,
    retry_batches,
)
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.model import FailedAttempt
from tests.api.failure_fixture import ingest_fixture

UNKNOWN = "00000000-0000-4000-8000-000000000000"
fm = failed_messages.c

Attempts = dict[str, list[FailedAttempt]]


@pytest.fixture
def ids(writer: FailedMessageBatchWriter) -> list[str]:
    """The fixture's UniqueMessageIds, sorted (8 messages, all Unresolved)."""
    return sorted(ingest_fixture(writer))


def stored(engine: sa.Engine, unique_id: str) -> sa.Row[Any]:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(fm.status, fm.status_changed_at, fm.last_modified).where(fm.id == unique_id)
        ).one()


def counts(engine: sa.Engine) -> Counter[FailedMessageStatus]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(fm.status, sa.func.count()).group_by(fm.status)).all()
    return Counter({FailedMessageStatus(status): count for status, count in rows})


def summary(client: TestClient) -> Any:
    response = client.get("/api/errors/counts")
    assert response.status_code == 200
    return response.json()


def set_status(engine: sa.Engine, status: FailedMessageStatus, *unique_ids: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.update(failed_messages).where(fm.id.in_(unique_ids)).values(status=int(status))
        )


# --- archive and unarchive ----------------------------------------------------------------
def test_archive_unarchive_round_trip(
    client: TestClient, engine: sa.Engine, ids: list[str]
) -> None:
    chosen = ids[:3]
    before = {unique_id: stored(engine, unique_id) for unique_id in ids}
    started = datetime.now(UTC)

    response = client.patch("/api/errors/archive", json=chosen)
    assert response.status_code == 202
    assert response.json() == {"changed": 3, "unchanged_ids": []}
    for unique_id in ids:
        row = stored(engine, unique_id)
        if unique_id in chosen:
            assert row.status == FailedMessageStatus.ARCHIVED
            assert row.status_changed_at >= started
            assert row.last_modified == row.status_changed_at
        else:
            assert row == before[unique_id]
    assert counts(engine) == {FailedMessageStatus.UNRESOLVED: 5, FailedMessageStatus.ARCHIVED: 3}
    assert summary(client) == {"unresolved": 5, "resolved": 0, "retryIssued": 0, "archived": 3}
    assert client.get(f"/api/errors/{chosen[0]}").json()["status"] == "archived"

    archived_at = stored(engine, chosen[0]).status_changed_at
    response = client.patch("/api/errors/unarchive", json=chosen[:2])
    assert response.status_code == 202
    assert response.json() == {"changed": 2, "unchanged_ids": []}
    row = stored(engine, chosen[0])
    assert row.status == FailedMessageStatus.UNRESOLVED
    assert row.status_changed_at >= archived_at
    assert counts(engine) == {FailedMessageStatus.UNRESOLVED: 7, FailedMessageStatus.ARCHIVED: 1}
    assert summary(client) == {"unresolved": 7, "resolved": 0, "retryIssued": 0, "archived": 1}
    assert client.get(f"/api/errors/{chosen[0]}").json()["status"] == "unresolved"


@pytest.mark.parametrize("method", ["POST", "PATCH"])
@pytest.mark.parametrize("path", ["/api/errors/archive", "/api/errors/archive/"])
def test_bulk_archive_methods_and_trailing_slash(
    client: TestClient, engine: sa.Engine, ids: list[str], method: str, path: str
) -> None:
    response = client.request(method, path, json=ids[:2])
    assert response.status_code == 202
    assert counts(engine)[FailedMessageStatus.ARCHIVED] == 2


def test_unknown_ids_refuse_the_whole_list(
    client: TestClient, engine: sa.Engine, ids: list[str]
) -> None:
    other = str(uuid.uuid4())
    response = client.patch("/api/errors/archive", json=[ids[0], UNKNOWN, other])
    assert response.status_code == 422
    assert sorted(response.json()["unknown_ids"]) == sorted([UNKNOWN, other])
    assert "nothing was changed" in response.json()["detail"]
    assert counts(engine) == {FailedMessageStatus.UNRESOLVED: 8}

    response = client.patch("/api/errors/unarchive", json=[UNKNOWN])
    assert response.status_code == 422
    assert response.json()["unknown_ids"] == [UNKNOWN]


def test_messages_not_in_the_actions_status_are_reported_unchanged(
    client: TestClient, engine: sa.Engine, ids: list[str]
) -> None:
    set_status(engine, FailedMessageStatus.RESOLVED, ids[1])
    set_status(engine, FailedMessageStatus.RETRY_ISSUED, ids[2])
    client.patch("/api/errors/archive", json=[ids[3]])
    before = stored(engine, ids[3])

    response = client.patch("/api/errors/archive", json=ids[:4])
    assert response.json() == {"changed": 1, "unchanged_ids": ids[1:4]}
    assert stored(engine, ids[1]).status == FailedMessageStatus.RESOLVED
    assert stored(engine, ids[2]).status == FailedMessageStatus.RETRY_ISSUED
    assert stored(engine, ids[3]) == before  # already archived: not stamped again

    response = client.patch("/api/errors/unarchive", json=[ids[1], ids[3]])
    assert response.json() == {"changed": 1, "unchanged_ids": [ids[1]]}


def test_ids_are_matched_whatever_their_case(
    client: TestClient, engine: sa.Engine, ids: list[str]
) -> None:
    response = client.patch("/api/errors/archive", json=[ids[0].upper()])
    assert response.json()["changed"] == 1


def test_bad_ids_are_422_naming_the_body(client: TestClient, ids: list[str]) -> None:
    response = client.patch("/api/errors/archive", json=["not-a-uuid"])
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][0] == "body"
    assert client.patch("/api/errors/archive", json={"ids": ids}).status_code == 422


def test_empty_list_changes_nothing(client: TestClient, engine: sa.Engine, ids: list[str]) -> None:
    response = client.patch("/api/errors/archive", json=[])
    assert response.status_code == 202
    assert response.json() == {"changed": 0, "unchanged_ids": []}


# --- one message --------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_archive_one(client: TestClient, engine: sa.Engine, ids: list[str], method: str) -> None:
    response = client.request(method, f"/api/errors/{ids[0]}/archive")
    assert response.status_code == 202
    assert response.json() == {"changed": 1, "unchanged_ids": []}
    assert stored(engine, ids[0]).status == FailedMessageStatus.ARCHIVED
    again = client.request(method, f"/api/errors/{ids[0]}/archive")
    assert again.json() == {"changed": 0, "unchanged_ids": [ids[0]]}


def test_archive_one_unknown_is_404_and_non_uuid_422(client: TestClient) -> None:
    assert client.patch(f"/api/errors/{UNKNOWN}/archive").status_code == 404
    assert client.patch("/api/errors/nope/archive").status_code == 422


# --- resolve pending retries --------------------------------------------------------------
def issue_retries(engine: sa.Engine, *unique_ids: str) -> None:
    """Make ``unique_ids`` RetryIssued with a retry claim each, as the retry flow would."""
    now = datetime.now(UTC)
    batch_id = str(uuid.uuid4())
    with engine.begin() as conn:
        conn.execute(
            sa.insert(retry_batches).values(
                id=batch_id,
                request_id="test",
                retry_type="MultipleMessages",
                status="Staging",
                initial_batch_size=len(unique_ids),
                started_at=now,
                last_modified=now,
            )
        )
        conn.execute(
            sa.insert(failed_message_retries),
            [{"failed_message_id": item, "retry_batch_id": batch_id} for item in unique_ids],
        )
    set_status(engine, FailedMessageStatus.RETRY_ISSUED, *unique_ids)


def claims(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.select(failed_message_retries.c.failed_message_id)).scalars())


@pytest.mark.parametrize("key", ["uniquemessageids", "ids"])
def test_resolve_pending_retries_by_id(
    client: TestClient, engine: sa.Engine, ids: list[str], key: str
) -> None:
    issue_retries(engine, *ids[:3])
    set_status(engine, FailedMessageStatus.ARCHIVED, ids[5])
    response = client.patch(
        "/api/pendingretries/resolve", json={key: [ids[0], ids[1], ids[4], ids[5]]}
    )
    assert response.status_code == 202
    # ids[4] was never retried: resolved too (docs/decisions.md
    # "Resolving pending retries includes messages never retried"); an archived message is not.
    assert response.json() == {"changed": 3, "unchanged_ids": [ids[5]]}
    assert stored(engine, ids[0]).status == FailedMessageStatus.RESOLVED
    assert stored(engine, ids[4]).status == FailedMessageStatus.RESOLVED
    assert stored(engine, ids[5]).status == FailedMessageStatus.ARCHIVED
    assert claims(engine) == {ids[2]}

    response = client.patch("/api/pendingretries/resolve", json={key: [ids[2], UNKNOWN]})
    assert response.status_code == 422
    assert response.json()["unknown_ids"] == [UNKNOWN]
    assert stored(engine, ids[2]).status == FailedMessageStatus.RETRY_ISSUED
    assert claims(engine) == {ids[2]}


def test_resolve_pending_retries_by_range_is_inclusive(
    client: TestClient, engine: sa.Engine, ids: list[str]
) -> None:
    issue_retries(engine, *ids[:4])
    base = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
    with engine.begin() as conn:
        for offset, unique_id in enumerate(ids[:4]):
            conn.execute(
                sa.update(failed_messages)
                .where(fm.id == unique_id)
                .values(last_modified=base + timedelta(minutes=offset))
            )
    # ids[1] and ids[2] sit exactly on the bounds; ids[0] and ids[3] are outside.
    response = client.patch(
        "/api/pendingretries/resolve",
        json={"from": "2026-03-01T12:01:00Z", "to": "2026-03-01T12:02:00"},
    )
    assert response.status_code == 202
    assert response.json()["changed"] == 2
    statuses = {unique_id: stored(engine, unique_id).status for unique_id in ids[:4]}
    assert statuses == {
        ids[0]: FailedMessageStatus.RETRY_ISSUED,
        ids[1]: FailedMessageStatus.RESOLVED,
        ids[2]: FailedMessageStatus.RESOLVED,
        ids[3]: FailedMessageStatus.RETRY_ISSUED,
    }
    assert claims(engine) == {ids[0], ids[3]}
    assert counts(engine)[FailedMessageStatus.UNRESOLVED] == 4  # untouched by the range


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"from": "2026-01-01T00:00:00Z"},
        {"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"},
        {"from": "yesterday", "to": "2026-01-01T00:00:00Z"},
        {"uniquemessageids": [UNKNOWN], "from": "2026-01-01T00:00:00Z", "to": "2026-01-02"},
    ],
)
def test_resolve_needs_ids_or_a_range(client: TestClient, body: dict[str, Any]) -> None:
    response = client.patch("/api/pendingretries/resolve", json=body)
    assert response.status_code == 422
