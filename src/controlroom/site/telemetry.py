"""The telemetry packet a site sends for each transition, in the contract central
validates it with (``controlroom.telemetry.contract``). Pure.

Source: docs/decisions.md "Telemetry is refused, never truncated": the call's whole state plus one
audit event naming the transition. The event is idempotent at central on ``event_id``; its
``correlation_id`` is the tracked operation id, and its ``details_json`` keeps what the state's
bounded columns cannot (the whole error text).
"""

from __future__ import annotations

import json
from typing import Any

from controlroom.site.lifecycle import CallState, Transition
from controlroom.telemetry.stamps import Stamp

AUDIT_CATEGORY = "CachedCall"
_FAILURE_ACTIONS = frozenset({"CachedCallAttempted", "CachedCallParked", "CachedCallFailed"})


def _instant(value: Stamp | None) -> str | None:
    # Seven digits always: the 100 ns a stamp may carry travel to central.
    return None if value is None else value.isoformat()


def state_document(state: CallState) -> dict[str, Any]:
    """``state`` as the JSON object of the contract (also a row of the pull contract)."""
    return {
        "tracked_operation_id": state.tracked_operation_id,
        "channel": state.channel,
        "target": state.target,
        "source_site": state.source_site,
        "source_node": state.source_node,
        "status": str(state.status),
        "retry_count": state.retry_count,
        "last_error": state.last_error,
        "http_status": state.http_status,
        "created_at_utc": _instant(state.created_at_utc),
        "updated_at_utc": _instant(state.updated_at_utc),
        "terminal_at_utc": _instant(state.terminal_at_utc),
        "epoch": state.epoch,
    }


def telemetry_packet(transition: Transition, *, event_id: str, actor: str) -> dict[str, Any]:
    """The packet reporting ``transition``, with its audit event ``event_id`` by ``actor``
    (the site itself, or the operator whose command it applied)."""
    state = transition.state
    details: dict[str, Any] = {
        "status": str(state.status),
        "epoch": state.epoch,
        "retry_count": state.retry_count,
    }
    if state.http_status is not None:
        details["http_status"] = state.http_status
    if transition.error_detail is not None:
        details["error"] = transition.error_detail
    packet = state_document(state)
    packet["audit_event"] = {
        "event_id": event_id,
        "occurred_at_utc": _instant(state.updated_at_utc),
        "actor": actor,
        "action": transition.action,
        "outcome": "Failure" if transition.action in _FAILURE_ACTIONS else "Success",
        "category": AUDIT_CATEGORY,
        "target": state.target,
        "source_node": state.source_node,
        "correlation_id": state.tracked_operation_id,
        "details_json": json.dumps(details, sort_keys=True),
        "payload_truncated": False,
    }
    return packet
