"""The Retry/Discard relay: an operator's command on a Parked site call, sent to its site.

Source: docs/design.md "Retry/Discard relay"; docs/decisions.md "Central relays
Retry/Discard and never edits the row". Only Parked rows
are actionable (a Failed call failed permanently and would fail again). Central reads its
mirror, sends the command to the owning site's agent with a timeout, and reports one of
four outcomes; it never edits the ``site_calls`` row: the site applies the command and
its telemetry (a new ``epoch`` for Retry) updates the mirror. An applied command writes
one audit event (action ``CachedResolve``, the operator as actor, the tracked operation id
as correlation id, channel and target in the details); a failed audit write is logged and
never changes the outcome. An id central no longer has (purged) is ``None``: not found,
and no audit event.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.providers import provider_for
from controlroom.db.tables import site_calls
from controlroom.db.transactions import begin_write
from controlroom.event_types import EventType
from controlroom.events import Category, Severity, record_event
from controlroom.runtime.clock import Clock, utc_now
from controlroom.sitecalls.reconciliation import site_headers
from controlroom.sitecalls.site_requests import (
    MAX_COMMAND_ANSWER_BYTES,
    AnswerTooLarge,
    AnswerTooSlow,
    SiteAnswer,
    request_site,
)
from controlroom.telemetry.ordering import SiteCallStatus

log = logging.getLogger(__name__)

AUDIT_ACTION = "CachedResolve"
AUDIT_CATEGORY = "CachedCall"


class Command(enum.StrEnum):
    """What an operator asks of a Parked call."""

    RETRY = "retry"
    DISCARD = "discard"


_RELAYED = {
    Command.RETRY: EventType.SITE_CALL_RETRY_RELAYED,
    Command.DISCARD: EventType.SITE_CALL_DISCARD_RELAYED,
}
"""The event log item of an applied command."""


class RelayOutcome(enum.StrEnum):
    """docs/design.md "Retry/Discard relay" outcomes."""

    APPLIED = "Applied"
    NOT_PARKED = "NotParked"
    SITE_UNREACHABLE = "SiteUnreachable"
    OPERATION_FAILED = "OperationFailed"


@dataclass(frozen=True, slots=True)
class RelayResult:
    """The outcome and a sentence an operator understands."""

    outcome: RelayOutcome
    message: str


async def relay_command(
    settings: Settings,
    engine: sa.Engine,
    tracked_operation_id: str,
    command: Command,
    operator: str,
    *,
    clock: Clock = utc_now,
) -> RelayResult | None:
    """Relay ``command`` on the call ``tracked_operation_id`` for ``operator``; ``None``
    when central has no such call. The store's reads and writes run in threads; the
    request to the site waits on the event loop, its whole answer within
    ``reconciliation.request_timeout`` (``site_requests.request_site``)."""
    row = await asyncio.to_thread(_site_call, engine, tracked_operation_id)
    if row is None:
        return None
    if row.status != SiteCallStatus.PARKED:
        return RelayResult(
            RelayOutcome.NOT_PARKED,
            f"the call is {row.status}, not Parked: only a Parked call can be retried or discarded",
        )
    site = next((s for s in settings.sites if s.id == row.source_site), None)
    if site is None:
        return RelayResult(
            RelayOutcome.OPERATION_FAILED, unrelayable_reason(settings, row.source_site) or ""
        )
    url = f"{site.base_url.rstrip('/')}/site/tracking/{tracked_operation_id}/{command}"
    try:
        answer = await request_site(
            "POST",
            url,
            headers=site_headers(site),
            json_body={"operator": operator},
            timeout=settings.reconciliation.request_timeout,
            max_bytes=MAX_COMMAND_ANSWER_BYTES,
        )
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        return RelayResult(
            RelayOutcome.SITE_UNREACHABLE,
            f"site {site.id} could not be reached ({type(exc).__name__}); nothing was "
            "changed, try again when it is back",
        )
    except AnswerTooLarge as exc:
        return RelayResult(
            RelayOutcome.OPERATION_FAILED,
            f"site {site.id} answered the command with more than a relay's answer ({exc}); "
            "it may have been applied: the call's status will tell once its telemetry arrives",
        )
    except (httpx.HTTPError, AnswerTooSlow) as exc:
        # The command left: the site may have applied it without answering in time.
        return RelayResult(
            RelayOutcome.SITE_UNREACHABLE,
            f"site {site.id} did not answer in time ({type(exc).__name__}); the command "
            "may have been applied: the call's status will tell once its telemetry arrives",
        )
    result = _interpret(site.id, answer)
    if result.outcome is RelayOutcome.APPLIED:
        await asyncio.to_thread(_audit, engine, row, command, operator, clock)
    return result


def _site_call(engine: sa.Engine, tracked_operation_id: str) -> Any:
    """Central's row of the call, ``None`` when it has none."""
    with engine.connect() as conn:
        return conn.execute(
            sa.select(site_calls).where(site_calls.c.tracked_operation_id == tracked_operation_id)
        ).first()


def unrelayable_reason(settings: Settings, source_site: str) -> str | None:
    """Why no command can be relayed to a call of ``source_site``: central has no address
    for that site (it is not in ``sites``); ``None`` when it has one. The console offers
    Retry/Discard only where this is ``None``, and shows the reason otherwise."""
    if any(site.id == source_site for site in settings.sites):
        return None
    return (
        f"site {source_site!r} is not configured at central (sites), so the command "
        "cannot be sent to it"
    )


def _interpret(site_id: str, response: SiteAnswer) -> RelayResult:
    try:
        outcome = response.json().get("outcome")
    except (ValueError, AttributeError):
        outcome = None
    if response.status_code == 200 and outcome == "Applied":
        return RelayResult(
            RelayOutcome.APPLIED,
            f"site {site_id} applied the command; the call's new state arrives with its telemetry",
        )
    if response.status_code == 409 and outcome == "NotParked":
        status = response.json().get("status")
        return RelayResult(
            RelayOutcome.NOT_PARKED,
            f"site {site_id} says the call is {status}, not Parked (central's copy is behind)",
        )
    if response.status_code == 404 and outcome == "NotFound":
        return RelayResult(RelayOutcome.OPERATION_FAILED, f"site {site_id} does not know this call")
    return RelayResult(
        RelayOutcome.OPERATION_FAILED,
        f"site {site_id} answered HTTP {response.status_code} to the command; it may not "
        "have been applied",
    )


def _audit(engine: sa.Engine, row: Any, command: Command, operator: str, clock: Clock) -> None:
    """One audit event for an applied command, and its event log item in the same
    transaction; a failure is logged, never raised."""
    now = clock()
    event = {
        "event_id": str(uuid.uuid4()),
        "occurred_at_utc": now,
        "occurred_at_tick": 0,  # central's own clock reads microseconds
        "ingested_at_utc": now,
        "actor": operator,
        "action": AUDIT_ACTION,
        "outcome": "Success",
        "category": AUDIT_CATEGORY,
        "target": row.target,
        "source_site": row.source_site,
        "source_node": row.source_node,
        "correlation_id": row.tracked_operation_id,
        "details_json": json.dumps(
            {"command": command.title(), "channel": row.channel, "target": row.target},
            sort_keys=True,
        ),
        "payload_truncated": False,
    }
    try:
        with begin_write(engine) as conn:
            provider_for(engine).insert_audit_events(conn, [event])
            record_event(
                conn,
                description=(
                    f"{operator} relayed {command.title()} of site call "
                    f"{row.tracked_operation_id} to site {row.source_site}: applied"
                ),
                severity=Severity.INFO,
                category=Category.SITE_CALLS,
                event_type=_RELAYED[command],
                raised_at=now,
                related_to=[f"/site-call/{row.tracked_operation_id}", f"/site/{row.source_site}"],
            )
    except Exception:
        log.exception(
            "the audit event of %s on %s by %s was not written (the command was applied)",
            command,
            row.tracked_operation_id,
            operator,
        )
