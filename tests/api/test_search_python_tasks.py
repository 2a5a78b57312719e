"""Search finds failed Python tasks by task name, exception type (short and qualified)
and argument values, on every provider: a Celery-shaped and a Dramatiq-shaped failed
message built by hand from the header contract (tests/python_tasks.py), beside a .NET one."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt
from controlroom.errors.read.search import search_failed_messages
from tests.nsb import failed_headers
from tests.python_tasks import celery_failure, dramatiq_failure


@pytest.fixture
def tasks(writer: FailedMessageBatchWriter) -> dict[str, FailedAttempt]:
    failures = {
        "celery": celery_failure("4f1c2a9e-celery-task"),
        "dramatiq": dramatiq_failure("8b0d7c31-dramatiq-message"),
        "dotnet": (failed_headers("dotnet-1"), b'{"OrderId": "ORD-1"}'),
    }
    stored = {
        name: parse_failed_message(headers, body, max_body_size_to_store=102_400)
        for name, (headers, body) in failures.items()
    }
    writer.write(IngestionBatch(attempts=list(stored.values())))
    return stored


def found(client: TestClient, text: str) -> set[str]:
    response = client.get("/api/messages/search", params={"q": text})
    assert response.status_code == 200, response.text
    return {item["id"] for item in response.json()}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # task and actor names
        ("shop.tasks.charge_card", "celery"),
        ("charge_card", "celery"),
        ("build_report", "dramatiq"),
        # exception types, short and qualified
        ("HTTPError", "celery"),
        ("requests.exceptions.HTTPError", "celery"),
        ("JSONDecodeError", "dramatiq"),
        ("json.decoder.JSONDecodeError", "dramatiq"),
        # argument values: positional and keyword, from the body
        ("order-4411", "celery"),
        ("tok_visa_4242", "celery"),
        ("quarterly-2026-q3", "dramatiq"),
        ("emea", "dramatiq"),
        # the application's frame in the traceback
        ("shop/payments.py", "celery"),
        ("load_rows", "dramatiq"),
    ],
)
def test_search_finds_python_tasks(
    client: TestClient, tasks: dict[str, FailedAttempt], text: str, expected: str
) -> None:
    assert found(client, text) == {tasks[expected].unique_message_id}


def test_the_console_search_finds_a_task_by_name_and_argument_together(
    engine: sa.Engine, tasks: dict[str, FailedAttempt]
) -> None:
    # The console's search: every word must occur in one message.
    with engine.connect() as conn:
        page = search_failed_messages(conn, "charge_card order-4411", offset=0, limit=10)
        assert [hit.summary.id for hit in page.items] == [tasks["celery"].unique_message_id]
        page = search_failed_messages(conn, "charge_card quarterly-2026-q3", offset=0, limit=10)
        assert page.items == []
