"""Values that flow through the error instance's write path (pure data, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

Headers = Mapping[str, str | None]
"""Message headers as received. A value may be ``None`` (NServiceBus writes null HelpLink)."""


@dataclass(frozen=True, slots=True)
class FailureGroup:
    """One group a failed message belongs to under one classifier."""

    id: str  # deterministic UUID of classifier + title (identity.group_id)
    classifier: str
    title: str


@dataclass(frozen=True, slots=True)
class KnownEndpoint:
    """An endpoint instance seen on a failed message (name + host)."""

    id: str  # deterministic UUID of name + host id (identity.known_endpoint_id)
    name: str
    host_id: str
    host: str | None


@dataclass(frozen=True, slots=True)
class BodyPlacement:
    """Where a body goes: inline text, external copy, or both (docs/design.md "Body placement").

    ``size`` is always the true size in bytes. ``text`` is the inline text (whole, or the
    searchable prefix of at most the cap when ``external``); ``None`` for binary bodies.
    """

    size: int
    text: str | None
    external: bool


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """One failed processing attempt of one message, as parsed from the error queue.

    Every field but ``headers``, ``body`` and ``body_key`` is a derived extraction of the
    headers. Times are timezone-aware UTC.
    """

    unique_message_id: str
    message_id: str
    time_of_failure: datetime
    queue_address: str
    receiving_endpoint: str
    headers: Headers
    headers_json: str
    content_type: str
    body: bytes
    body_placement: BodyPlacement
    body_key: str | None = None  # set when the body is stored externally
    receiving_host_id: str | None = None
    receiving_host: str | None = None
    sending_endpoint: str | None = None
    sending_host_id: str | None = None
    sending_host: str | None = None
    message_type: str | None = None
    time_sent: datetime | None = None
    is_system_message: bool = False
    conversation_id: str | None = None
    exception_type: str | None = None
    exception_message: str | None = None
    exception_source: str | None = None
    stack_trace: str | None = None
    groups: tuple[FailureGroup, ...] = ()
    endpoints: tuple[KnownEndpoint, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class FailedImport:
    """A message that could not be ingested, kept whole with the reason."""

    id: str  # deterministic: the same message gives the same id, so replays do not duplicate
    queue: str
    headers_json: str
    body: bytes
    reason: str
    failed_at: datetime
