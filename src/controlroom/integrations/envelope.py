"""The failed-message envelope of a Python task (pure: no broker, no I/O).

Source: docs/design.md "Python task queues". A task that failed for good reaches the
error queue as a failed message in NServiceBus's wire shape, so ingestion, grouping,
search and retry treat it like any other: the body is the task message's body, byte for
byte; the headers say what failed and where (``failed_message_headers``). Three headers
are Controlroom's own:

- ``Controlroom.TaskQueue``: ``celery`` or ``dramatiq`` (the "Python task" facet);
- ``Controlroom.TaskQueue.Properties``: the consumed message's broker properties and its
  typed header table as one JSON object (``properties_json``), which a retry restores so
  the worker receives the message as the producer sent it;
- ``Controlroom.TaskQueue.BodyNotKept``: why the body is absent (too large to send).

Two headers travel on the task message itself: ``Controlroom.TaskQueue.TimeSent``, when
a Celery producer with the integration installed published it (``time_sent``; a
failure's ``NServiceBus.TimeSent``), and ``Controlroom.TaskQueue.Redeliveries``, how many
times a worker process died holding the message (``redeliveries``,
``DEFAULT_MAX_WORKER_DEATHS``), never in a failed message's properties.

The failure is captured as text (``capture_failure``): never pickled, never re-raised,
so an exception that cannot be printed or pickled still makes a failed message.
"""

from __future__ import annotations

import traceback
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.identity import deterministic_id
from controlroom.errors.retries import wire as retry_wire
from controlroom.transport.properties import PROPERTY_NAMES as PROPERTY_NAMES
from controlroom.transport.properties import parse_properties as _parse_properties
from controlroom.transport.properties import properties_json as properties_json

TASK_QUEUE = "Controlroom.TaskQueue"
TASK_PROPERTIES = retry_wire.TASK_PROPERTIES
BODY_NOT_KEPT = "Controlroom.TaskQueue.BodyNotKept"
REDELIVERIES = "Controlroom.TaskQueue.Redeliveries"
"""On a task message the integration published again after a worker process died
holding it: the deaths so far (an AMQP integer; absent is 0)."""

TIME_SENT = "Controlroom.TaskQueue.TimeSent"
"""On a Celery task message whose producer has the integration installed: when it was
published, ISO 8601 in UTC (``2026-12-04T21:15:00.123456+00:00``). Celery's task
messages carry no time of sending of their own; Dramatiq's carry ``message_timestamp``."""

DEFAULT_MAX_WORKER_DEATHS = 3
"""A task message whose worker process died this many times while holding it is
reported as a failed message (``controlroom.integrations.WorkerDied``) instead of being
run again. More than 1: a message merely prefetched by a worker that another task
killed is redelivered too, and must not be reported for one death."""
RETRIES = "NServiceBus.Retries"

CELERY = "celery"
DRAMATIQ = "dramatiq"
KINDS = (CELERY, DRAMATIQ)

MAX_TRACEBACK_CHARS = 32_768
"""A traceback longer than this keeps its first and last halves around a line saying how
many characters were cut: the innermost frames and the exception line (at the end) and
the outermost frames (at the start) are what classification and an operator read."""

MAX_MESSAGE_CHARS = 4_096
"""The exception's message beyond this is cut with a marker saying how much."""


@dataclass(frozen=True)
class CapturedFailure:
    """What failed, as text: ``exception_type`` (qualified: ``module.Qualname``, builtins
    unqualified as Python prints them), ``message`` (``str(exc)``, or a placeholder
    when that raises), ``source`` (the exception's module), ``traceback`` (the formatted
    traceback with its chained causes and contexts, bounded by ``MAX_TRACEBACK_CHARS``)."""

    exception_type: str
    message: str
    source: str
    traceback: str


def capture_failure(exc: BaseException, *, traceback_text: str | None = None) -> CapturedFailure:
    """``exc`` as text, never raising: an exception whose ``__str__`` fails gets the
    placeholder ``<exception str() failed>`` (as ``traceback`` prints it); lone
    surrogates become backslash escapes, since header values are UTF-8.
    ``traceback_text``: the traceback already formatted where ``exc`` was raised, for an
    exception that crossed a process boundary without its ``__traceback__`` (Celery's
    pool sends it so)."""
    kind = type(exc)
    module = _plain(getattr(kind, "__module__", None) or "builtins", "builtins")
    qualname = _plain(getattr(kind, "__qualname__", None) or kind.__name__, kind.__name__)
    name = qualname if module == "builtins" else f"{module}.{qualname}"
    message = _plain(exc, "<exception str() failed>")
    try:
        text = traceback_text or "".join(traceback.format_exception(exc))
    except Exception:  # a broken __traceback__ or cause chain: the type still tells
        text = f"{name}: {message}\n"
    return CapturedFailure(
        exception_type=_header_text(name),
        message=_bounded(_header_text(message), MAX_MESSAGE_CHARS),
        source=_header_text(module),
        traceback=_bounded(_header_text(text), MAX_TRACEBACK_CHARS),
    )


def host_id(host: str) -> str:
    """The ``$.diagnostics.hostid`` of a worker host: a GUID derived from its name, so
    one host keeps one id across restarts (NServiceBus derives it from machine and
    path)."""
    return deterministic_id(host)


def failed_message_headers(
    *,
    kind: str,
    task_id: str,
    task_name: str,
    queue: str,
    endpoint: str,
    host: str,
    failure: CapturedFailure,
    time_of_failure: datetime,
    time_sent: datetime | None = None,
    retries: int = 0,
    content_type: str | None = None,
    properties: Mapping[str, Any] | None = None,
    retry_unique_message_id: str | None = None,
    body_not_kept: str | None = None,
) -> dict[str, str | None]:
    """The headers of a Python task's failed message (docs/design.md "Python task
    queues"): ``task_id`` is the message id, ``queue`` the failed queue (where a retry
    goes), ``endpoint`` the processing endpoint (the app), ``task_name`` the message
    type. ``properties`` are the consumed message's broker properties (``PROPERTY_NAMES``;
    others are ignored); ``retry_unique_message_id`` is the
    ``ServiceControl.Retry.UniqueMessageId`` the consumed message carried, so a retried
    task that fails again folds into the same failed message.

    Raises ``ValueError`` for an unknown ``kind``, a naive time or a negative
    ``retries``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if retries < 0:
        raise ValueError("retries must not be negative")
    headers: dict[str, str | None] = {
        h.MESSAGE_ID: task_id,
        h.FAILED_Q: queue,
        h.PROCESSING_ENDPOINT: endpoint,
        h.PROCESSING_MACHINE: host,
        h.HOST_DISPLAY_NAME: host,
        h.HOST_ID: host_id(host),
        h.ENCLOSED_MESSAGE_TYPES: task_name,
        h.TIME_OF_FAILURE: retry_wire.format_nsb_time(time_of_failure),
        h.EXCEPTION_TYPE: failure.exception_type,
        h.EXCEPTION_MESSAGE: failure.message,
        h.EXCEPTION_SOURCE: failure.source,
        h.EXCEPTION_STACK_TRACE: failure.traceback,
        RETRIES: str(retries),
        TASK_QUEUE: kind,
    }
    if time_sent is not None:
        headers[h.TIME_SENT] = retry_wire.format_nsb_time(time_sent)
    if content_type is not None:
        headers[h.CONTENT_TYPE] = content_type
    if properties is not None:
        headers[TASK_PROPERTIES] = properties_json(properties)
    if retry_unique_message_id is not None:
        headers[h.RETRY_UNIQUE_MESSAGE_ID] = retry_unique_message_id
    if body_not_kept is not None:
        headers[BODY_NOT_KEPT] = body_not_kept
    return headers


def confirmation_headers(
    unique_message_id: str, processed_at: datetime | None = None
) -> dict[str, str | None]:
    """The control message confirming that the retry of failed message
    ``unique_message_id`` succeeded (``processed_at`` default now, UTC), as an NServiceBus
    endpoint sends it to ``ServiceControl.Retry.AcknowledgementQueue``; its body is
    empty."""
    return retry_wire.confirmation_headers(
        unique_message_id, str(uuid.uuid4()), processed_at or datetime.now(UTC)
    )


def _plain(value: object, placeholder: str) -> str:
    """``str(value)`` as a plain ``str`` (a subclass's methods may raise), or
    ``placeholder`` when ``str()`` raises or gives no text (any class may set
    ``__module__`` to any object; ``__str__`` may return anything)."""
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:
        return placeholder
    return str.__str__(text) if isinstance(text, str) else placeholder


def redeliveries(headers: Mapping[str, Any] | None) -> int:
    """The ``REDELIVERIES`` count of a task message's AMQP header table: 0 when absent or
    not a non-negative integer (an int, or its text or bytes)."""
    value = (headers or {}).get(REDELIVERIES)
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if isinstance(value, bool):
        return 0
    try:
        count = int(value) if isinstance(value, int | str) else 0
    except ValueError:
        return 0
    return max(0, count)


def time_sent(headers: Mapping[str, Any] | None) -> datetime | None:
    """The ``TIME_SENT`` of a task message's AMQP header table as an aware UTC time;
    ``None`` when absent or not an ISO 8601 time (a naive one is read as UTC)."""
    value = (headers or {}).get(TIME_SENT)
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if isinstance(value, datetime):
        sent = value
    elif isinstance(value, str):
        try:
            sent = datetime.fromisoformat(value)
        except ValueError:
            return None
    else:
        return None
    return (sent if sent.tzinfo is not None else sent.replace(tzinfo=UTC)).astimezone(UTC)


def without_redeliveries(headers: Mapping[str, Any]) -> dict[str, Any]:
    """``headers`` without ``REDELIVERIES``: what a failed message keeps, so a retry from
    Controlroom counts worker deaths from zero."""
    return {name: value for name, value in headers.items() if name != REDELIVERIES}


def _header_text(text: str) -> str:
    """``text`` as a header value can carry it: lone surrogates as backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _bounded(text: str, limit: int) -> str:
    """``text`` or, when longer than ``limit``, its first and last halves around a line
    saying how many characters were cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    cut = len(text) - 2 * half
    return f"{text[:half]}\n... {cut} characters cut ...\n{text[-half:]}"


def parse_properties(text: str) -> dict[str, Any]:
    """The broker properties ``properties_json`` wrote, with bytes and datetimes back.

    Raises ``ValueError`` when ``text`` is not a JSON object of known property names.
    """
    return _parse_properties(text, header=TASK_PROPERTIES)
