"""The "Python task" facet on every provider: failed Celery and Dramatiq tasks counted by
task queue from the ``Python Task Queue`` groups (the API's groups of that classifier,
and ``errors/read/facets.python_task_facet``). The console's filter:
tests/web/test_console_python_tasks.py."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.errors.ingest.grouping import PYTHON_TASK_QUEUE
from controlroom.errors.ingest.identity import group_id
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.read.facets import TaskQueueFacetValue, python_task_facet
from tests.nsb import failed_headers
from tests.python_tasks import celery_failure, dramatiq_failure

CELERY = group_id(PYTHON_TASK_QUEUE, "celery")
DRAMATIQ = group_id(PYTHON_TASK_QUEUE, "dramatiq")


def ingest(writer: FailedMessageBatchWriter) -> dict[str, str]:
    """Two Celery tasks, one Dramatiq actor and a .NET message; their ids by message id."""
    failures = [
        celery_failure("celery-1"),
        celery_failure("celery-2", host="worker-2"),
        dramatiq_failure("dramatiq-1"),
        (failed_headers("dotnet-1"), b"{}"),
    ]
    batch = [
        parse_failed_message(headers, body, max_body_size_to_store=102_400)
        for headers, body in failures
    ]
    writer.write(IngestionBatch(attempts=batch, endpoints=[e for a in batch for e in a.endpoints]))
    return {attempt.message_id: attempt.unique_message_id for attempt in batch}


def test_the_facet_counts_unresolved_tasks_by_task_queue(
    engine: sa.Engine, writer: FailedMessageBatchWriter, client: TestClient
) -> None:
    with engine.connect() as conn:
        assert python_task_facet(conn) == []
    ids = ingest(writer)
    with engine.connect() as conn:
        assert python_task_facet(conn) == [
            TaskQueueFacetValue("celery", 2, CELERY),
            TaskQueueFacetValue("dramatiq", 1, DRAMATIQ),
        ]
    response = client.patch("/api/errors/archive", json=[ids["celery-1"], ids["dramatiq-1"]])
    assert response.status_code == 202
    with engine.connect() as conn:
        # A task queue whose failures are all archived stays a choice, with 0 unresolved.
        assert python_task_facet(conn) == [
            TaskQueueFacetValue("celery", 1, CELERY),
            TaskQueueFacetValue("dramatiq", 0, DRAMATIQ),
        ]


def test_the_api_lists_the_task_queue_groups_and_their_messages(
    writer: FailedMessageBatchWriter, client: TestClient
) -> None:
    ids = ingest(writer)
    groups = client.get(f"/api/recoverability/groups/{PYTHON_TASK_QUEUE}").json()
    assert {(g["title"], g["count"], g["id"]) for g in groups} == {
        ("celery", 2, CELERY),
        ("dramatiq", 1, DRAMATIQ),
    }
    listed = client.get(f"/api/recoverability/groups/{CELERY}/errors").json()
    assert sorted(item["id"] for item in listed) == sorted([ids["celery-1"], ids["celery-2"]])
