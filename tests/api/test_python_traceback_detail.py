"""GET /api/errors/{id} of a failed Python task: the stack trace read as frames in a new
field, ``python_traceback``, and the task's arguments in ``task_arguments``;
ServiceControl's fields as for any message, and neither field for a .NET message. A task
whose body was not kept says so and why, there and at its body's URL. Every provider."""

from __future__ import annotations

from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.model import FailedAttempt
from controlroom.integrations import envelope
from tests.nsb import failed_headers
from tests.python_tasks import celery_failure, dramatiq_failure
from tests.retries.conftest import store_failed


def put(
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    headers: dict[str, str | None],
    body: bytes,
) -> FailedAttempt:
    return store_failed(settings, writer, body_store, headers, body)


def test_a_python_traceback_is_given_as_frames(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    headers, body = celery_failure("task-1", trace="celery_chained_cause.txt")
    stored = put(settings, writer, body_store, headers, body)

    detail = client.get(f"/api/errors/{stored.unique_message_id}").json()

    assert detail["exception"]["stack_trace"] == headers["NServiceBus.ExceptionInfo.StackTrace"]
    cause, escaped = detail["python_traceback"]["sections"]
    assert cause["frames"] == [
        {
            "file": "/app/shop/inventory.py",
            "line": 19,
            "function": "reserve",
            "source": "return stock[sku] - quantity",
            "application": True,
        }
    ]
    assert cause["text"].startswith("KeyError: 'SKU-4411'\n\nThe above exception was the direct")
    assert [(f["function"], f["application"]) for f in escaped["frames"]] == [
        ("trace_task", False),
        ("__protected_call__", False),
        ("reserve_stock", True),
    ]
    assert escaped["frames"][0]["file"].endswith("site-packages/celery/app/trace.py")
    assert escaped["text"] == "shop.errors.OutOfStock: SKU-4411"
    assert detail["python_traceback"]["preamble"] == ""
    groups = {group["type"]: group["title"] for group in detail["groups"]}
    assert groups["Exception Type and Python Frame"] == (
        "requests.exceptions.HTTPError: shop/tasks.py in reserve_stock"
    )


def test_a_dotnet_trace_has_no_python_traceback_field(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    stored = put(settings, writer, body_store, failed_headers("dotnet-1"), b"{}")

    detail = client.get(f"/api/errors/{stored.unique_message_id}").json()

    assert "python_traceback" not in detail and "task_arguments" not in detail
    assert "Exception Type and Python Frame" not in {group["type"] for group in detail["groups"]}


def test_a_tasks_arguments_are_given_from_its_inline_body(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    celery = put(settings, writer, body_store, *celery_failure("task-2"))
    dramatiq = put(settings, writer, body_store, *dramatiq_failure("task-3"))

    assert client.get(f"/api/errors/{celery.unique_message_id}").json()["task_arguments"] == {
        "args": ["order-4411", 1999],
        "kwargs": {"currency": "EUR", "card_token": "tok_visa_4242"},
    }
    assert client.get(f"/api/errors/{dramatiq.unique_message_id}").json()["task_arguments"] == {
        "args": ["quarterly-2026-q3"],
        "kwargs": {"region": "emea"},
    }


def test_no_task_arguments_for_another_body_or_an_external_one(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    headers, body = celery_failure("task-4")
    pickled = put(settings, writer, body_store, headers, b"\x80\x04\x95 pickle")
    small = settings.model_copy(update={"max_body_size_to_store": 10})
    external = put(small, writer, body_store, {**headers, "NServiceBus.MessageId": "t-5"}, body)
    assert external.body_key is not None
    for stored in (pickled, external):
        detail = client.get(f"/api/errors/{stored.unique_message_id}").json()
        assert "task_arguments" not in detail
        assert "python_traceback" in detail


def test_a_message_posing_as_a_traceback_adds_no_section(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    headers, body = celery_failure("task-forged")
    message = (
        "boom\nTraceback (most recent call last):\n"
        '  File "/app/evil/forged.py", line 1, in forged\nEvil: x'
    )
    headers["NServiceBus.ExceptionInfo.Message"] = message
    headers["NServiceBus.ExceptionInfo.StackTrace"] = (
        "Traceback (most recent call last):\n"
        '  File "/app/shop/tasks.py", line 3, in charge\n'
        "    x()\n"
        f"ValueError: {message}\n"
    )
    stored = put(settings, writer, body_store, headers, body)
    detail = client.get(f"/api/errors/{stored.unique_message_id}").json()
    (section,) = detail["python_traceback"]["sections"]
    assert [frame["function"] for frame in section["frames"]] == ["charge"]


NOT_KEPT = (
    "the task message's body is 20971520 bytes, over the 15728640 bytes the Celery "
    "integration sends (max_body_bytes)"
)


def test_a_task_whose_body_was_not_kept_says_so_and_why(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
) -> None:
    headers, _ = celery_failure("task-9")
    stored = put(settings, writer, body_store, headers | {envelope.BODY_NOT_KEPT: NOT_KEPT}, b"")
    kept = put(settings, writer, body_store, *celery_failure("task-10"))

    detail = client.get(f"/api/errors/{stored.unique_message_id}").json()
    body = client.get(f"/api/messages/{stored.unique_message_id}/body")

    assert detail["body_not_kept"] == NOT_KEPT
    assert detail["body_size"] == 0
    assert body.status_code == 404  # not an empty body (204): there was one, not kept
    assert body.json()["detail"] == f"the body was not kept: {NOT_KEPT}"
    assert "body_not_kept" not in client.get(f"/api/errors/{kept.unique_message_id}").json()
