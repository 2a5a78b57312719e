"""Archived group views as ServiceControl shows them, on every provider: a
group's comment is shown in the Unresolved views, not in the archived ones."""

from __future__ import annotations

from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.grouping import EXCEPTION_TYPE_AND_STACK_TRACE
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from tests.nsb import failed_headers
from tests.retries.conftest import store_failed


def test_the_comment_is_not_shown_for_an_archived_group(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    first, second = (
        store_failed(settings, writer, body_store, failed_headers(name)) for name in ("a", "b")
    )
    group_id = next(g.id for g in first.groups if g.classifier == EXCEPTION_TYPE_AND_STACK_TRACE)
    response = client.post(
        f"/api/recoverability/groups/{group_id}/comment", params={"comment": "known issue"}
    )
    assert response.status_code == 202
    client.patch("/api/errors/archive", json=[first.unique_message_id])

    unresolved = client.get(f"/api/recoverability/groups/id/{group_id}").json()
    archived = client.get(f"/api/archive/groups/id/{group_id}").json()
    (archived_listed,) = client.get("/api/errors/groups").json()

    assert unresolved["comment"] == "known issue"
    assert "comment" not in archived
    assert "comment" not in archived_listed
    assert archived["count"] == archived_listed["count"] == 1
    assert second.unique_message_id  # the other message keeps the group Unresolved
