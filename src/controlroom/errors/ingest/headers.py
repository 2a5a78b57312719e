"""The wire contract: NServiceBus header names and the pure parsing of header values.

Source: docs/design.md "Wire contract"; where docs/design.md is silent, ServiceControl's own parsing
(``EndpointDetailsParser``, ``MessageTypeEnricher``, ``ErrorIngestor``), cited per function.
Real header sets: ``../shared/samples/nsb_error_headers.json``.

Conventions of every function here:

* A header whose value is ``None`` is treated as absent (NServiceBus v5-v9 write a null
  ``HelpLink``), and so is an empty or all-white-space value of an optional header.
* Nothing here raises but ``MessageRejected`` (the message's own fault: it becomes a failed
  import), and only where noted.
* All work is linear in the size of the values; no regular expression runs over an
  unbounded value.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime

from controlroom.errors.model import Headers
from controlroom.exceptions import MessageRejected
from controlroom.transport.base import CONTENT_ENCODING_HEADER

# --- header names (NServiceBus) -----------------------------------------------------------
MESSAGE_ID = "NServiceBus.MessageId"
FAILED_Q = "NServiceBus.FailedQ"
PROCESSING_ENDPOINT = "NServiceBus.ProcessingEndpoint"
PROCESSING_MACHINE = "NServiceBus.ProcessingMachine"
TIME_OF_FAILURE = "NServiceBus.TimeOfFailure"
TIME_SENT = "NServiceBus.TimeSent"
EXCEPTION_TYPE = "NServiceBus.ExceptionInfo.ExceptionType"
EXCEPTION_MESSAGE = "NServiceBus.ExceptionInfo.Message"
EXCEPTION_SOURCE = "NServiceBus.ExceptionInfo.Source"
EXCEPTION_STACK_TRACE = "NServiceBus.ExceptionInfo.StackTrace"
ENCLOSED_MESSAGE_TYPES = "NServiceBus.EnclosedMessageTypes"
CONVERSATION_ID = "NServiceBus.ConversationId"
CONTENT_TYPE = "NServiceBus.ContentType"
ORIGINATING_ENDPOINT = "NServiceBus.OriginatingEndpoint"
ORIGINATING_MACHINE = "NServiceBus.OriginatingMachine"
ORIGINATING_ADDRESS = "NServiceBus.OriginatingAddress"
REPLY_TO_ADDRESS = "NServiceBus.ReplyToAddress"
MESSAGE_INTENT = "NServiceBus.MessageIntent"
CONTROL_MESSAGE = "NServiceBus.ControlMessage"
HOST_ID = "$.diagnostics.hostid"
HOST_DISPLAY_NAME = "$.diagnostics.hostdisplayname"
ORIGINATING_HOST_ID = "$.diagnostics.originating.hostid"
METRIC_INSTANCE_ID = "NServiceBus.Metric.InstanceId"  # "Endpoint Instance" classifier

# --- header names (ServiceControl retries) ------------------------------------------------
RETRY_UNIQUE_MESSAGE_ID = "ServiceControl.Retry.UniqueMessageId"
RETRY_SUCCESSFUL = "ServiceControl.Retry.Successful"

TEXT_ONLY = (MESSAGE_ID, FAILED_Q, RETRY_UNIQUE_MESSAGE_ID)
"""The headers that name a message and where it failed: a table or an array there makes
a failed import, since its JSON would name a queue or a message that no endpoint has
(docs/decisions.md "A table or an array where the wire contract reads text")."""

# --- header names (Controlroom: Python task queues) ---------------------------------------
# Written by controlroom.integrations (docs/design.md "Python task queues"); the integrations
# import these wire modules, never the reverse, so the names are repeated in its envelope.
TASK_QUEUE = "Controlroom.TaskQueue"
TASK_QUEUE_KINDS = ("celery", "dramatiq")
BODY_NOT_KEPT = "Controlroom.TaskQueue.BodyNotKept"
"""Why a failed task's body was not sent with its failure (too large): its body is empty
and a retry has nothing to send (docs/decisions.md "A task body too large is not sent,
the failure is")."""

# --- body encoding ------------------------------------------------------------------------
# NServiceBus has no standard body-encoding header. A transport that sees a compressed body
# (AMQP ``content_encoding``, HTTP-style bridges) must put it under CONTENT_ENCODING;
# NSB_CONTENT_ENCODING is honoured too for producers that namespace it.
CONTENT_ENCODING = CONTENT_ENCODING_HEADER
NSB_CONTENT_ENCODING = "NServiceBus.ContentEncoding"

DEFAULT_CONTENT_TYPE = "application/octet-stream"
"""The content type of a body whose message names none: binary, as ServiceControl treats
it (docs/design.md "Wire contract")."""

# Wire time format "yyyy-MM-dd HH:mm:ss:ffffff Z" (UTC). Fewer (or a 7th, .NET tick)
# fraction digits and no fraction are tolerated. ASCII digits only.
_NSB_TIME_RE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2}) ([0-9]{2}):([0-9]{2}):([0-9]{2})(?::([0-9]{1,7}))? Z"
)
_MAX_TIME_LEN = 64  # longer than any sane timestamp: refuse before any parsing work
# NServiceBus's own reading (DateTimeOffsetHelper.ToDateTimeOffset): a value exactly as long
# as the format, an ASCII digit wherever the format has a digit letter, any character
# elsewhere. Each letter names the field the digit belongs to.
_NSB_WIRE_FORMAT = "yyyy-MM-dd HH:mm:ss:ffffff Z"

# The GUID spellings .NET writes: "D" (8-4-4-4-12), "N" (32 hex), "B" ({D}), "P" ((D)).
# Stricter than uuid.UUID(), which also takes "urn:uuid:" prefixes and hyphens anywhere.
_D = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_GUID_RE = re.compile(rf"[0-9a-fA-F]{{32}}|{_D}|\{{{_D}\}}|\({_D}\)")
_CANONICAL_GUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# --- generic value access -----------------------------------------------------------------
def header_text(headers: Headers, name: str) -> str | None:
    """The value of an optional header, or ``None`` when absent, null, empty or blank."""
    value = headers.get(name)
    if value is None or not value.strip():
        return None
    return value


def task_queue(headers: Headers) -> str | None:
    """``celery`` or ``dramatiq`` when ``Controlroom.TaskQueue`` names one of them (case and
    white space ignored), else ``None``: the message is not a Python task's."""
    value = (headers.get(TASK_QUEUE) or "").strip().lower()
    return value if value in TASK_QUEUE_KINDS else None


def body_not_kept(headers: Headers) -> str | None:
    """Why the message's body was not kept (``Controlroom.TaskQueue.BodyNotKept``), or
    ``None`` when it was (absent, empty or blank)."""
    return header_text(headers, BODY_NOT_KEPT)


def sanitize_text(text: str) -> str:
    """``text`` made storable in every provider's text column, for derived columns only.

    NUL (refused by PostgreSQL ``text``) and lone surrogates (not encodable as UTF-8) become
    U+FFFD. ``headers_json`` keeps the exact values; this is for indexing copies.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)
    return text


# --- GUIDs --------------------------------------------------------------------------------
def parse_guid(text: str) -> str | None:
    """``text`` as a lower-case "D" form GUID, or ``None`` when it is not a GUID.

    Accepts the .NET spellings "D", "N", "B" and "P" in either case; nothing else, not even
    surrounding white space.
    """
    if len(text) > 38 or _GUID_RE.fullmatch(text) is None:
        return None
    return str(uuid.UUID(text.strip("{}()")))


def is_canonical_guid(text: str) -> bool:
    """True when ``text`` is a lower-case "D" form GUID, the form every stored id takes."""
    return len(text) == 36 and _CANONICAL_GUID_RE.fullmatch(text) is not None


def normalize_host_id(text: str) -> str:
    """A host id as stored: "D" form when it is a GUID, else the raw value.

    NServiceBus writes ``$.diagnostics.hostid`` as a 32-hex "N" GUID (see the samples);
    ServiceControl parses it with ``Guid.Parse`` and prints it in "D" form, which is what
    ``identity.known_endpoint_id`` hashes. A non-GUID host id (a custom host id provider)
    is kept as written rather than refused.
    """
    return parse_guid(text) or text


def retry_unique_message_id(headers: Headers) -> str | None:
    """``ServiceControl.Retry.UniqueMessageId`` in "D" form, or ``None`` when absent.

    Raises ``MessageRejected`` naming the header when it is present but not a GUID (it
    becomes a row key and a body-store path, so it is never taken on trust).
    """
    value = headers.get(RETRY_UNIQUE_MESSAGE_ID)
    if value is None:
        return None
    parsed = parse_guid(value)
    if parsed is None:
        raise MessageRejected(f"header {RETRY_UNIQUE_MESSAGE_ID} is not a GUID: {value[:100]!r}")
    return parsed


# --- times --------------------------------------------------------------------------------
def parse_nsb_time(text: str, *, header: str = "timestamp") -> datetime:
    """Parse an NServiceBus wire timestamp into an aware UTC ``datetime``.

    Format ``yyyy-MM-dd HH:mm:ss:ffffff Z`` (UTC; docs/design.md "Wire contract"). A value of
    the format's length (28) is read as NServiceBus reads it: digits at the format's digit
    positions, any other character ignored (``2020-10-31 13,59,25,359877 Z`` is valid).
    Other lengths: 0-7 fraction digits (a 7th digit, a .NET tick, is truncated), or ISO
    8601 as a lenient fallback (``datetime.fromisoformat``; a value without an offset is
    read as UTC, one with an offset is converted to UTC).

    Raises ``MessageRejected`` naming ``header`` when the value is none of these.
    """
    value = text.strip()
    if len(value) <= _MAX_TIME_LEN:
        match = _NSB_TIME_RE.fullmatch(value)
        try:
            if len(value) == len(_NSB_WIRE_FORMAT):
                return _nservicebus_time(value)
            if match is not None:
                return _wire_time(match)
            return _iso_time(value)
        except (ValueError, OverflowError):
            pass  # out-of-range field (month 13, year 9999 west of UTC) or not ISO 8601
    raise MessageRejected(f"header {header} is not a timestamp: {text[:100]!r}")


def _nservicebus_time(value: str) -> datetime:
    """``value`` (28 characters) read as NServiceBus reads it; ``ValueError`` when a digit
    position holds something else or a field is out of range."""
    fields = dict.fromkeys("yMdHmsf", 0)
    for letter, char in zip(_NSB_WIRE_FORMAT, value, strict=True):
        if letter in fields:
            if not "0" <= char <= "9":
                raise ValueError(f"not a digit: {char!r}")
            fields[letter] = fields[letter] * 10 + ord(char) - ord("0")
    return datetime(
        fields["y"],
        fields["M"],
        fields["d"],
        fields["H"],
        fields["m"],
        fields["s"],
        fields["f"],
        tzinfo=UTC,
    )


def _wire_time(match: re.Match[str]) -> datetime:
    year, month, day, hour, minute, second, fraction = match.groups()
    micro = int((fraction or "0")[:6].ljust(6, "0"))
    return datetime(
        int(year), int(month), int(day), int(hour), int(minute), int(second), micro, tzinfo=UTC
    )


def _iso_time(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


# --- addresses and endpoints --------------------------------------------------------------
def split_address(address: str) -> tuple[str, str | None]:
    """Split an NServiceBus address ``queue@machine`` at its first ``@``.

    Returns ``(queue, machine)``; ``machine`` is ``None`` when there is no ``@`` (or nothing
    after it). Source: ServiceControl ``EndpointDetailsParser.ExtractQueueAndMachineName``.
    """
    queue, at, machine = address.partition("@")
    return queue, (machine or None) if at else None


def _queue_of(headers: Headers, name: str) -> str | None:
    address = header_text(headers, name)
    if address is None:
        return None
    return split_address(address)[0] or None


def processing_endpoint(headers: Headers) -> str | None:
    """The endpoint that failed to process the message, or ``None`` when undeterminable.

    ``NServiceBus.ProcessingEndpoint``, else ``NServiceBus.FailedQ`` before ``@`` (v5
    messages have no ProcessingEndpoint), else ``NServiceBus.ReplyToAddress`` before ``@``.
    Source: docs/design.md "Wire contract".
    """
    return (
        header_text(headers, PROCESSING_ENDPOINT)
        or _queue_of(headers, FAILED_Q)
        or _queue_of(headers, REPLY_TO_ADDRESS)
    )


def receiving_host_id(headers: Headers) -> str | None:
    """Host id of the processing endpoint (``$.diagnostics.hostid``), normalised."""
    value = header_text(headers, HOST_ID)
    return normalize_host_id(value) if value is not None else None


def receiving_host(headers: Headers) -> str | None:
    """Host name of the processing endpoint.

    ``$.diagnostics.hostdisplayname``, else ``NServiceBus.ProcessingMachine``, else the
    machine part of ``NServiceBus.FailedQ``. Source: ServiceControl
    ``EndpointDetailsParser.ReceivingEndpoint``.
    """
    host = header_text(headers, HOST_DISPLAY_NAME) or header_text(headers, PROCESSING_MACHINE)
    if host is not None:
        return host
    failed_q = header_text(headers, FAILED_Q)
    return split_address(failed_q)[1] if failed_q is not None else None


def sending_endpoint(headers: Headers) -> str | None:
    """The endpoint that sent the message.

    ``NServiceBus.OriginatingEndpoint``, else ``NServiceBus.OriginatingAddress`` before
    ``@``. Source: ServiceControl ``EndpointDetailsParser.SendingEndpoint``.
    """
    return header_text(headers, ORIGINATING_ENDPOINT) or _queue_of(headers, ORIGINATING_ADDRESS)


def sending_host_id(headers: Headers) -> str | None:
    """Host id of the sending endpoint (``$.diagnostics.originating.hostid``), normalised."""
    value = header_text(headers, ORIGINATING_HOST_ID)
    return normalize_host_id(value) if value is not None else None


def sending_host(headers: Headers) -> str | None:
    """Host name of the sending endpoint: ``NServiceBus.OriginatingMachine``, else the
    machine part of ``NServiceBus.OriginatingAddress``."""
    host = header_text(headers, ORIGINATING_MACHINE)
    if host is not None:
        return host
    address = header_text(headers, ORIGINATING_ADDRESS)
    return split_address(address)[1] if address is not None else None


# --- message type -------------------------------------------------------------------------
def message_type(headers: Headers) -> str | None:
    """The message type: the first comma-separated part of ``NServiceBus.EnclosedMessageTypes``,
    stripped (the assembly-qualified rest is dropped); ``None`` when absent or empty.

    Several types are separated by ``;`` and the first one's assembly qualification by
    ``,``, so the first ``,`` part is the most derived type's full name.
    """
    enclosed = header_text(headers, ENCLOSED_MESSAGE_TYPES)
    if enclosed is None:
        return None
    first = enclosed.partition(",")[0].strip()
    return first or None


# Scheduled tasks are NServiceBus's own messages carried under a user-looking type.
_SCHEDULED_TASK_TYPE = "NServiceBus.Scheduling.Messages.ScheduledTask"


def is_system_message(headers: Headers) -> bool:
    """True when the message is NServiceBus infrastructure rather than a user message.

    ServiceControl's rule (``MessageTypeEnricher``), reproduced: when
    ``NServiceBus.EnclosedMessageTypes`` is present, the message is a system message
    exactly when its message type contains ``NServiceBus.Scheduling.Messages.ScheduledTask``
    (the type decides, even over a control-message header); without it, when
    ``NServiceBus.ControlMessage`` is present. ServiceControl tests for the header's
    presence; here a value of ``false`` (any case) also counts as absent.
    """
    kind = message_type(headers)
    if kind is not None:
        return _SCHEDULED_TASK_TYPE in kind
    return _is_control_message(headers)


def _is_control_message(headers: Headers) -> bool:
    value = headers.get(CONTROL_MESSAGE)
    return value is not None and value.strip().lower() != "false"


# --- body description ---------------------------------------------------------------------
def content_type(headers: Headers) -> str:
    """``NServiceBus.ContentType``, default ``application/octet-stream``: a body of no
    named type is binary, as in ServiceControl (docs/design.md "Wire contract")."""
    return header_text(headers, CONTENT_TYPE) or DEFAULT_CONTENT_TYPE


def content_encoding(headers: Headers) -> str | None:
    """The body's content encoding (``Content-Encoding``, else ``NServiceBus.ContentEncoding``),
    ``None`` when the body is not encoded. ``identity`` (RFC 9110: no encoding) counts as none.
    """
    value = header_text(headers, CONTENT_ENCODING) or header_text(headers, NSB_CONTENT_ENCODING)
    if value is None or value.strip().lower() == "identity":
        return None
    return value


# --- storage ------------------------------------------------------------------------------
def headers_to_json(headers: Headers) -> str:
    """The headers as the stored source of truth (``headers_json``).

    Stable: keys sorted, compact separators, so the same headers always give the same text.
    ``ensure_ascii=False`` keeps non-ASCII readable and searchable; ``None`` values stay
    ``null``; control characters (NUL included) are ``\\uXXXX`` escapes as JSON requires.
    Lone surrogates cannot be stored as UTF-8, so a header set containing one is written
    with ``ensure_ascii=True`` instead, which escapes them and still round-trips exactly.
    """
    text = json.dumps(dict(headers), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(dict(headers), sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return text
