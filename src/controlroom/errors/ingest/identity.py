"""Deterministic ids of the error instance: UniqueMessageId, failure group id, endpoint id.

Every id is ServiceControl's ``DeterministicGuid.MakeId``: the MD5 of the UTF-8 text, read as
a .NET ``Guid`` (whose first three fields are little-endian, hence ``bytes_le``) and printed
in the lower-case "D" form. Same input, same id, on every process and every replay, so
ids match the ones ServiceControl computes. Source: docs/design.md "Identity".
"""

from __future__ import annotations

import functools
import hashlib
import uuid

from controlroom.errors.ingest import headers as h
from controlroom.errors.model import Headers
from controlroom.exceptions import MessageRejected

ID_CACHE_SIZE = 4096
"""Group and endpoint ids kept per process. A workload has few distinct groups and
endpoint instances (hundreds) against one id computed per group row and per message, so
the ids are cached; bounded, so that a stream of distinct classifications (a message type
per message, say) costs memory no more than this many ids (about 1 MB)."""


def deterministic_id(text: str) -> str:
    """The deterministic UUID of ``text``, lower-case "D" form (36 characters).

    ``str(uuid.UUID(bytes_le=md5(text.encode("utf-8")).digest()))``: ServiceControl's
    ``DeterministicGuid.MakeId`` (which hashes the concatenation of its arguments). A lone
    surrogate (undecodable transport bytes) is hashed as its raw code unit rather than
    raising, so every ``str`` has an id.
    """
    data = text.encode("utf-8", "surrogatepass")
    return str(uuid.UUID(bytes_le=hashlib.md5(data, usedforsecurity=False).digest()))


def unique_message_id(headers: Headers) -> str:
    """The UniqueMessageId of a failed message: the key of its ``failed_messages`` row.

    ``ServiceControl.Retry.UniqueMessageId`` when present (a message ServiceControl retried
    that failed again keeps its id), normalised to the lower-case "D" form; else
    ``deterministic_id(message_id + processing_endpoint)``.

    Raises ``MessageRejected`` naming the header when the retry header is not a GUID, when
    ``NServiceBus.MessageId`` is missing or empty, or when there is no processing endpoint.
    Source: docs/design.md "Identity".
    """
    retry_id = h.retry_unique_message_id(headers)
    if retry_id is not None:
        return retry_id
    message_id = headers.get(h.MESSAGE_ID)
    if not message_id:
        raise MessageRejected(f"header {h.MESSAGE_ID} is missing or empty")
    processing_endpoint = h.processing_endpoint(headers)
    if processing_endpoint is None:
        raise MessageRejected(
            "cannot determine the processing endpoint (NServiceBus.ProcessingEndpoint, "
            "NServiceBus.FailedQ and NServiceBus.ReplyToAddress are all missing or empty)"
        )
    return deterministic_id(message_id + processing_endpoint)


@functools.lru_cache(maxsize=ID_CACHE_SIZE)
def group_id(classifier: str, classification: str) -> str:
    """Id of the failure group ``classification`` under ``classifier`` (ServiceControl's)."""
    return deterministic_id(classifier + classification)


@functools.lru_cache(maxsize=ID_CACHE_SIZE)
def known_endpoint_id(name: str, host_id: str) -> str:
    """Id of the endpoint instance ``name`` on host ``host_id``.

    ``host_id`` is the host id as stored: a "D" form GUID when the header held a GUID (as
    .NET's ``Guid.ToString()`` prints it, so the id matches ServiceControl's), else the raw
    header value.
    """
    return deterministic_id(name + host_id)


def failed_import_id(headers: Headers, headers_json: str, body: bytes) -> str:
    """The identity of a failed import: the same message failing to import twice is one row.

    ``deterministic_id(message_id + endpoint)`` when the message names its
    ``NServiceBus.MessageId`` (the endpoint: ``headers.processing_endpoint``, empty when
    none can be told), so a redelivery with changed headers is the same import; else the
    SHA-256 of ``headers_json`` and ``body`` as a UUID (the content is all there is).
    """
    message_id = h.header_text(headers, h.MESSAGE_ID)
    if message_id is not None:
        return deterministic_id(message_id + (h.processing_endpoint(headers) or ""))
    digest = hashlib.sha256(headers_json.encode() + b"\0" + body).digest()
    return str(uuid.UUID(bytes=digest[:16]))
