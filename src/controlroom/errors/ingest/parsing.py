"""From one message of the error queue to a ``FailedAttempt`` (pure: no I/O).

The caller first asks ``is_retry_confirmation``; any other message is a failed message for
``parse_failed_message``. A ``MessageRejected`` from either is the message's own fault: the
message is kept whole as a failed import with ``reason`` (docs/design.md "Failed imports").

Derived columns follow docs/design.md "Wire contract" and ServiceControl's parsing (see
``headers``). They are extractions for indexing; ``headers_json`` and the body are the
stored truth, so derived text is made storable (``headers.sanitize_text``: NUL and lone
surrogates become U+FFFD) while ``headers_json`` keeps every value exactly.
"""

from __future__ import annotations

from datetime import UTC, datetime

from controlroom.db.tables import failed_messages
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.bodies import body_key, place_body
from controlroom.errors.ingest.grouping import classify
from controlroom.errors.ingest.identity import known_endpoint_id, unique_message_id
from controlroom.errors.model import FailedAttempt, Headers, KnownEndpoint
from controlroom.exceptions import MessageRejected


def _column_length(name: str) -> int:
    length = getattr(failed_messages.c[name].type, "length", None)
    if not isinstance(length, int):
        raise TypeError(f"failed_messages.{name} has no length limit")
    return length


# Longest value per derived column, in characters, read from the schema so they cannot drift.
# A longer value is refused (a failed import naming the header), never truncated: every
# provider then behaves alike (SQLite would store it, PostgreSQL would fail the batch).
_LIMITS = {
    column: _column_length(column)
    for column in (
        "message_id",
        "conversation_id",
        "queue_address",
        "receiving_endpoint",
        "receiving_host_id",
        "receiving_host",
        "sending_endpoint",
        "sending_host_id",
        "sending_host",
        "content_type",
    )
}


def is_retry_confirmation(headers: Headers) -> str | None:
    """The UniqueMessageId ("D" form) a retry confirmation resolves, or ``None``.

    A confirmation is any message carrying ``ServiceControl.Retry.Successful`` (whatever
    its value, even empty): that is ServiceControl's own test (``ErrorIngestor``). It does
    not require ``NServiceBus.ControlMessage``: endpoints set it on their acknowledgements,
    but ServiceControl's audit instance sends acknowledgements without it.

    Raises ``MessageRejected`` naming ``ServiceControl.Retry.UniqueMessageId`` when a
    confirmation lacks it or it is not a GUID.
    """
    if h.RETRY_SUCCESSFUL not in headers:
        return None
    unique_id = h.retry_unique_message_id(headers)
    if unique_id is None:
        raise MessageRejected(
            f"retry confirmation ({h.RETRY_SUCCESSFUL}) without header {h.RETRY_UNIQUE_MESSAGE_ID}"
        )
    return unique_id


def parse_failed_message(
    headers: Headers,
    body: bytes,
    *,
    max_body_size_to_store: int,
    received_at: datetime | None = None,
) -> FailedAttempt:
    """Parse one failed message into its ``FailedAttempt`` (every derived column, groups,
    endpoints, body placement).

    ``max_body_size_to_store`` is the inline cap in bytes (``bodies.place_body``);
    ``body_key`` is set exactly when the placement is external, and the caller must store
    ``body`` under it before the row commits. ``endpoints`` holds the receiving endpoint
    (``processing_endpoint``, ``$.diagnostics.hostid``) and the sending endpoint
    (``NServiceBus.OriginatingEndpoint``, ``$.diagnostics.originating.hostid``), each only
    when its host id is known, without duplicates.

    ``NServiceBus.FailedQ`` and ``NServiceBus.MessageId`` alone make a failed message
    (ServiceControl's rule): without ``NServiceBus.TimeOfFailure`` the time of failure is
    ``received_at`` (when it was ingested; now, UTC, when not given).

    Raises ``MessageRejected`` naming the header when ``NServiceBus.FailedQ`` is missing,
    ``NServiceBus.MessageId`` is missing, ``NServiceBus.TimeOfFailure`` is not a
    timestamp, ``ServiceControl.Retry.UniqueMessageId`` is not a GUID, or a value is
    longer than its column. An unparseable optional ``NServiceBus.TimeSent`` only leaves
    ``time_sent`` empty (the header itself is kept in ``headers_json``).
    """
    queue_address = _required(headers, h.FAILED_Q)
    message_id = _required(headers, h.MESSAGE_ID)
    failed_at = h.header_text(headers, h.TIME_OF_FAILURE)
    if failed_at is not None:
        time_of_failure = h.parse_nsb_time(failed_at, header=h.TIME_OF_FAILURE)
    else:
        time_of_failure = received_at if received_at is not None else datetime.now(UTC)
    receiving_endpoint = h.processing_endpoint(headers)
    if receiving_endpoint is None:  # FailedQ is present, so only an address like "@machine"
        raise MessageRejected(f"header {h.FAILED_Q} names no queue: {queue_address[:100]!r}")
    unique_id = unique_message_id(headers)
    content_type = h.content_type(headers)

    columns: dict[str, str | None] = {
        "message_id": message_id,
        "queue_address": queue_address,
        "receiving_endpoint": receiving_endpoint,
        "receiving_host_id": h.receiving_host_id(headers),
        "receiving_host": h.receiving_host(headers),
        "sending_endpoint": h.sending_endpoint(headers),
        "sending_host_id": h.sending_host_id(headers),
        "sending_host": h.sending_host(headers),
        "conversation_id": h.header_text(headers, h.CONVERSATION_ID),
        "content_type": content_type,
    }
    _check_lengths(columns)
    text = {name: _clean(value) for name, value in columns.items()}

    data = bytes(body)
    placement = place_body(data, content_type, h.content_encoding(headers), max_body_size_to_store)
    return FailedAttempt(
        unique_message_id=unique_id,
        message_id=h.sanitize_text(message_id),
        time_of_failure=time_of_failure,
        queue_address=h.sanitize_text(queue_address),
        receiving_endpoint=h.sanitize_text(receiving_endpoint),
        headers=dict(headers),
        headers_json=h.headers_to_json(headers),
        content_type=h.sanitize_text(content_type),
        body=data,
        body_placement=placement,
        body_key=body_key(unique_id, data) if placement.external else None,
        receiving_host_id=text["receiving_host_id"],
        receiving_host=text["receiving_host"],
        sending_endpoint=text["sending_endpoint"],
        sending_host_id=text["sending_host_id"],
        sending_host=text["sending_host"],
        message_type=_clean(h.message_type(headers)),
        time_sent=_optional_time(headers, h.TIME_SENT),
        is_system_message=h.is_system_message(headers),
        conversation_id=text["conversation_id"],
        exception_type=_clean(headers.get(h.EXCEPTION_TYPE)),
        exception_message=_clean(headers.get(h.EXCEPTION_MESSAGE)),
        exception_source=_clean(headers.get(h.EXCEPTION_SOURCE)),
        stack_trace=_clean(headers.get(h.EXCEPTION_STACK_TRACE)),
        groups=classify(headers),
        endpoints=_known_endpoints(text),
    )


def _required(headers: Headers, name: str) -> str:
    value = h.header_text(headers, name)
    if value is None:
        raise MessageRejected(f"header {name} is missing or empty")
    return value


# Which header(s) each length-checked column comes from, for the rejection reason.
_SOURCES = {
    "message_id": h.MESSAGE_ID,
    "queue_address": h.FAILED_Q,
    "receiving_endpoint": f"{h.PROCESSING_ENDPOINT} / {h.FAILED_Q} / {h.REPLY_TO_ADDRESS}",
    "receiving_host_id": h.HOST_ID,
    "receiving_host": f"{h.HOST_DISPLAY_NAME} / {h.PROCESSING_MACHINE} / {h.FAILED_Q}",
    "sending_endpoint": f"{h.ORIGINATING_ENDPOINT} / {h.ORIGINATING_ADDRESS}",
    "sending_host_id": h.ORIGINATING_HOST_ID,
    "sending_host": f"{h.ORIGINATING_MACHINE} / {h.ORIGINATING_ADDRESS}",
    "conversation_id": h.CONVERSATION_ID,
    "content_type": h.CONTENT_TYPE,
}


def _check_lengths(columns: dict[str, str | None]) -> None:
    for name, value in columns.items():
        limit = _LIMITS[name]
        if value is not None and len(value) > limit:
            raise MessageRejected(
                f"header {_SOURCES[name]} is longer than {limit} characters "
                f"({len(value)}), the limit of column {name}"
            )


def _clean(value: str | None) -> str | None:
    return h.sanitize_text(value) if value is not None else None


def _optional_time(headers: Headers, name: str) -> datetime | None:
    value = h.header_text(headers, name)
    if value is None:
        return None
    try:
        return h.parse_nsb_time(value, header=name)
    except MessageRejected:
        return None


def _known_endpoints(columns: dict[str, str | None]) -> tuple[KnownEndpoint, ...]:
    """Receiving then sending endpoint, each when name and host id are known, de-duplicated
    (a message an endpoint sent to itself names one instance twice)."""
    found: dict[str, KnownEndpoint] = {}
    for name, host_id, host in (
        (columns["receiving_endpoint"], columns["receiving_host_id"], columns["receiving_host"]),
        (columns["sending_endpoint"], columns["sending_host_id"], columns["sending_host"]),
    ):
        if name is None or host_id is None:
            continue
        endpoint_id = known_endpoint_id(name, host_id)
        found.setdefault(endpoint_id, KnownEndpoint(endpoint_id, name, host_id, host))
    return tuple(found.values())
