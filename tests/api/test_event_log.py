"""docs/design.md "Event log": the event log, written in the transaction that did each thing and
served at ``GET /api/eventlogitems`` in ServiceControl's shape, per provider."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom import events
from controlroom.db.tables import FailedMessageStatus, event_log_items, failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import make_failed_import
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.read.operations import archive_messages
from controlroom.errors.retention import RetentionSweeper
from controlroom.errors.retries import requests as retries
from tests.api.failure_fixture import ingest_fixture
from tests.factories import at

SHAPE = {"id", "description", "severity", "raised_at", "related_to", "category", "event_type"}


INGESTED = "FailureGroupAppeared"
"""What ingesting the fixture logs by itself: each of its groups' first messages."""


def event_types(client: TestClient) -> list[str]:
    response = client.get("/api/eventlogitems", params={"per_page": 500})
    assert response.status_code == 200, response.text
    items = response.json()
    assert response.headers["Total-Count"] == str(len(items))
    for item in items:
        assert set(item) == SHAPE
        assert item["severity"] in {"info", "warning", "error", "critical"}
        assert item["raised_at"].endswith("Z")
    return [item["event_type"] for item in items]


def test_operator_actions_and_failures_are_logged_and_served_newest_first(
    client: TestClient, engine: sa.Engine, writer: FailedMessageBatchWriter
) -> None:
    ids = sorted(ingest_fixture(writer))
    assert set(event_types(client)) == {INGESTED}

    assert client.patch("/api/errors/archive", json=ids[:2]).status_code == 202
    assert client.patch("/api/errors/unarchive", json=ids[:1]).status_code == 202
    group_id = client.get("/api/recoverability/groups").json()[0]["id"]
    comment = client.post(f"/api/recoverability/groups/{group_id}/comment?comment=known")
    assert comment.status_code == 202
    assert client.post(f"/api/errors/{ids[3]}/retry").status_code == 202
    endpoint = client.get("/api/endpoints/known").json()[0]["id"]
    patched = client.patch(f"/api/endpoints/{endpoint}", json={"monitoring_enabled": True})
    assert patched.status_code == 202
    broken = make_failed_import({"a": "b"}, b"x", queue="error", reason="no FailedQ")
    writer.write(IngestionBatch(failed_imports=[broken]))

    logged = [event_type for event_type in event_types(client) if event_type != INGESTED]

    assert sorted(logged) == sorted(
        [
            "FailedMessagesArchived",
            "FailedMessagesUnArchived",
            "GroupCommentChanged",
            "RetryOperationRequested",
            "MonitoringEnabledForEndpoint",
            "MessageFailedToImport",
        ]
    )
    items = client.get("/api/eventlogitems").json()
    archived = next(i for i in items if i["event_type"] == "FailedMessagesArchived")
    assert archived["description"] == "2 failed messages archived by anonymous"
    assert archived["related_to"] == [f"/message/{i}" for i in ids[:2]]
    assert archived["category"] == "MessageFailures"
    failed_import = next(i for i in items if i["event_type"] == "MessageFailedToImport")
    assert failed_import["severity"] == "error" and "no FailedQ" in failed_import["description"]
    stamps = [item["raised_at"] for item in items]
    assert stamps == sorted(stamps, reverse=True)

    paged = client.get("/api/eventlogitems", params={"per_page": 2, "page": 2})
    every = len(event_types(client))  # the six above and the groups' first messages
    assert paged.headers["Total-Count"] == str(every) and len(paged.json()) == 2
    assert 'rel="next"' in paged.headers["Link"]


def test_an_event_rolls_back_with_its_transaction(engine: sa.Engine) -> None:
    with pytest.raises(RuntimeError), engine.begin() as conn:
        events.record_event(
            conn,
            description="never happened",
            severity="info",
            category="Test",
            event_type="GroupCommentChanged",
            raised_at=at(0),
        )
        raise RuntimeError("the work failed")
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(event_log_items)).scalar() == 0


def test_the_sweep_logs_itself_and_purges_events_past_their_period(
    engine: sa.Engine, writer: FailedMessageBatchWriter, tmp_path: Path
) -> None:
    ids = sorted(ingest_fixture(writer))
    with engine.begin() as conn:
        archive_messages(conn, ids[:3], at(0) - timedelta(days=40))
        events.record_event(
            conn,
            description="old",
            severity="info",
            category="Test",
            event_type="RetentionSweepCompleted",
            raised_at=at(0) - timedelta(days=20),
        )
        conn.execute(
            sa.update(failed_messages)
            .where(failed_messages.c.status == int(FailedMessageStatus.ARCHIVED))
            .values(status_changed_at=at(0) - timedelta(days=40))
        )
    sweeper = RetentionSweeper(
        engine,
        FileSystemBodyStore(tmp_path / "bodies"),
        retention_period=timedelta(days=15),
        event_retention_period=timedelta(days=14),
        clock=lambda: at(0),
    )

    assert sweeper.sweep_once().deleted == 3  # type: ignore[union-attr]

    with engine.connect() as conn:
        page = events.list_events(conn, offset=0, limit=100)
    (swept,) = [item for item in page.items if item.event_type != INGESTED]
    assert swept.event_type == "RetentionSweepCompleted"
    assert swept.description.startswith("retention deleted 3 ")
    assert "1 old event log items" in swept.description


def test_retry_finished_is_logged_with_its_counts(
    engine: sa.Engine, writer: FailedMessageBatchWriter
) -> None:
    ids = sorted(ingest_fixture(writer))
    with engine.begin() as conn:
        archive_messages(conn, [ids[0]], at(0))
    result = retries.retry_messages(engine, ids[1:3])
    with engine.begin() as conn:  # the processor's last step, done here by hand
        conn.execute(sa.text("UPDATE retry_batches SET status = 'done'"))
        retries.complete_operation_if_finished(conn, result.operation_id, at(0))
        page = events.list_events(conn, offset=0, limit=100)
    finished = [item for item in page.items if item.event_type == "RetryOperationCompleted"]
    assert len(finished) == 1
    assert finished[0].description.endswith("finished: 0 sent, 2 could not be sent")
    assert finished[0].related_to == (f"/retry/{result.operation_id}",)
