"""Failed Celery and Dramatiq tasks as their integrations send them to the error queue
(docs/design.md "Python task queues"), built by hand from the header contract so that the
console, API and search tests need no worker."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from controlroom.errors.ingest.grouping import PYTHON_TASK_QUEUE
from controlroom.errors.ingest.identity import group_id
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from tests.factories import at
from tests.nsb import failed_headers, nsb_time

TRACEBACKS = Path(__file__).parent / "data" / "python_tracebacks"


def sample_traceback(name: str) -> str:
    """A traceback of ``tests/data/python_tracebacks`` (see its README)."""
    return (TRACEBACKS / name).read_text(encoding="utf-8")


def celery_body(args: list[Any], kwargs: dict[str, Any]) -> bytes:
    """A Celery protocol 2 JSON body: ``[args, kwargs, embed]``."""
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    return json.dumps([args, kwargs, embed]).encode()


def dramatiq_body(
    message_id: str, actor: str, args: list[Any], kwargs: dict[str, Any], queue: str = "default"
) -> bytes:
    """A Dramatiq message body as its JSON encoder writes it."""
    return json.dumps(
        {
            "queue_name": queue,
            "actor_name": actor,
            "args": args,
            "kwargs": kwargs,
            "options": {"retries": 3, "traceback": "..."},
            "message_id": message_id,
            "message_timestamp": 1764844800000,
        }
    ).encode()


def task_failure_headers(
    kind: str,
    task_id: str,
    *,
    task_name: str,
    queue: str,
    exception_type: str,
    exception_message: str,
    traceback: str,
    host: str = "worker-1",
    endpoint: str = "shop",
    failed_at: datetime | None = None,
) -> dict[str, str | None]:
    """The headers of a failed ``kind`` (``celery`` or ``dramatiq``) task."""
    properties: dict[str, Any] = {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "correlation_id": task_id,
        "reply_to": None,
        "priority": 0,
        "message_id": task_id if kind == "dramatiq" else None,
        "headers": {"lang": "py", "task": task_name, "id": task_id, "retries": 0}
        if kind == "celery"
        else {"x-dramatiq": 1},
    }
    return {
        "NServiceBus.MessageId": task_id,
        "NServiceBus.FailedQ": queue,
        "NServiceBus.ProcessingEndpoint": endpoint,
        "NServiceBus.ProcessingMachine": host,
        "$.diagnostics.hostdisplayname": host,
        "$.diagnostics.hostid": "5c2a8f0e-9a57-4c3e-8d6b-1b1f2f0c7a11",
        "NServiceBus.EnclosedMessageTypes": task_name,
        "NServiceBus.TimeSent": nsb_time(at(-1)),
        "NServiceBus.TimeOfFailure": nsb_time(failed_at or at(0)),
        "NServiceBus.ExceptionInfo.ExceptionType": exception_type,
        "NServiceBus.ExceptionInfo.Message": exception_message,
        "NServiceBus.ExceptionInfo.Source": exception_type.rpartition(".")[0] or "builtins",
        "NServiceBus.ExceptionInfo.StackTrace": traceback,
        "NServiceBus.ContentType": "application/json",
        "NServiceBus.Retries": "3",
        "Controlroom.TaskQueue": kind,
        "Controlroom.TaskQueue.Properties": json.dumps(properties),
    }


CHARGE_CARD = "shop.tasks.charge_card"
HTTP_ERROR = "requests.exceptions.HTTPError"
HTTP_MESSAGE = "402 Client Error: Payment Required for url: https://pay.example.com/v1/charges"
BUILD_REPORT = "build_report"
JSON_ERROR = "json.decoder.JSONDecodeError"
JSON_MESSAGE = "Expecting value: line 1 column 1 (char 0)"


def celery_failure(
    task_id: str, *, host: str = "worker-1", trace: str = "celery_http_error.txt"
) -> tuple[dict[str, str | None], bytes]:
    """A failed ``shop.tasks.charge_card`` (Celery): headers and body."""
    headers = task_failure_headers(
        "celery",
        task_id,
        task_name=CHARGE_CARD,
        queue="payments",
        exception_type=HTTP_ERROR,
        exception_message=HTTP_MESSAGE,
        traceback=sample_traceback(trace),
        host=host,
    )
    return headers, celery_body(
        ["order-4411", 1999], {"currency": "EUR", "card_token": "tok_visa_4242"}
    )


def dramatiq_failure(task_id: str) -> tuple[dict[str, str | None], bytes]:
    """A failed ``build_report`` actor (Dramatiq): headers and body."""
    headers = task_failure_headers(
        "dramatiq",
        task_id,
        task_name=BUILD_REPORT,
        queue="reports",
        exception_type=JSON_ERROR,
        exception_message=JSON_MESSAGE,
        traceback=sample_traceback("dramatiq_json_error.txt"),
        endpoint="reports",
    )
    return headers, dramatiq_body(task_id, BUILD_REPORT, ["quarterly-2026-q3"], {"region": "emea"})


CELERY_GROUP = group_id(PYTHON_TASK_QUEUE, "celery")
DRAMATIQ_GROUP = group_id(PYTHON_TASK_QUEUE, "dramatiq")


def ingest_tasks(writer: FailedMessageBatchWriter) -> dict[str, str]:
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
