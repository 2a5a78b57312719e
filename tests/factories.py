"""Builders of write-path values for tests that do not go through header parsing."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from controlroom.errors.model import BodyPlacement, FailedAttempt, FailureGroup, KnownEndpoint

BASE_TIME = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """A UTC instant ``seconds`` after BASE_TIME."""
    return BASE_TIME + timedelta(seconds=seconds)


def message_uuid(n: int) -> str:
    return str(uuid.UUID(int=n + 1))


def attempt(
    n: int,
    failed_at: datetime,
    *,
    exception_message: str | None = None,
    endpoint: str = "Sales",
    groups: tuple[FailureGroup, ...] | None = None,
) -> FailedAttempt:
    """Attempt of message ``n`` failing at ``failed_at``; its payload names that time."""
    message = exception_message or f"failed at {failed_at.isoformat()}"
    headers = {"NServiceBus.MessageId": f"msg-{n}", "NServiceBus.FailedQ": endpoint}
    body = message.encode()
    group = FailureGroup(
        id=str(uuid.uuid5(uuid.NAMESPACE_URL, message)), classifier="Test", title=message
    )
    return FailedAttempt(
        unique_message_id=message_uuid(n),
        message_id=f"msg-{n}",
        time_of_failure=failed_at,
        queue_address=endpoint,
        receiving_endpoint=endpoint,
        headers=headers,
        headers_json=json.dumps(headers | {"attempt": message}, sort_keys=True),
        content_type="text/plain",
        body=body,
        body_placement=BodyPlacement(size=len(body), text=message, external=False),
        exception_type="System.Exception",
        exception_message=message,
        groups=groups if groups is not None else (group,),
    )


def endpoint(name: str, host_id: str = "0" * 32) -> KnownEndpoint:
    return KnownEndpoint(
        id=str(uuid.uuid5(uuid.NAMESPACE_URL, name + host_id)), name=name, host_id=host_id, host="h"
    )
