"""The "Python task" facet on every provider: failed Celery and Dramatiq tasks counted by
task queue from the ``Python Task Queue`` groups (the API's groups of that classifier,
and ``errors/read/facets.python_task_facet``). The console's filter:
tests/web/test_console_python_tasks.py."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.errors.ingest.grouping import PYTHON_TASK_QUEUE
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.read.facets import TaskQueueFacetValue, python_task_facet
from tests.python_tasks import CELERY_GROUP as CELERY
from tests.python_tasks import DRAMATIQ_GROUP as DRAMATIQ
from tests.python_tasks import ingest_tasks as ingest


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
