"""Rejected telemetry's life cycle: an operator re-submits a packet once its cause is
fixed, and the purge removes old rejections.

Source: docs/design.md "Rejected telemetry". A rejected packet (``rejected_telemetry``) is
kept whole, as received, until ``sitecalls.rejected_retention_days`` have passed
(``purge_rejected``, run by the site-call purge). Re-submitted, its bytes go through the
same contract and writer as when they came (a row pulled from a site also through the
rule that a site speaks for itself only). Accepted, the rejected row is deleted; rejected
again, it keeps its packet and takes the new reason. Either way one event log item
(``RejectedTelemetryResubmitted``) names the operator and the outcome, in the
transaction that deletes or updates the row. The packet's write commits before that
transaction: a failure between the two leaves the row to re-submit again, which is
harmless (the upsert is monotonic, the audit insert idempotent).
"""

from __future__ import annotations

import enum
import json
import uuid
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from controlroom.db.tables import REJECTED_NOTIFICATION_SOURCE, rejected_telemetry
from controlroom.db.transactions import begin_write
from controlroom.event_types import EventType
from controlroom.events import Category, Severity, record_event
from controlroom.runtime.clock import Clock, utc_now
from controlroom.sitecalls.intake import receive_bytes
from controlroom.sitecalls.reconciliation import PULLED_FROM
from controlroom.sitecalls.writer import ReceivedPacket, SiteCallWriter
from controlroom.telemetry.contract import foreign_source

rt = rejected_telemetry.c


class ResubmitOutcome(enum.StrEnum):
    ACCEPTED = "Accepted"
    """Stored (or a no-op under the monotonic rule); the rejected row is gone."""
    REJECTED = "Rejected"
    """Refused again; the rejected row holds the new reason."""


@dataclass(frozen=True, slots=True)
class Resubmission:
    """A re-submission's outcome: the rejected packet's ``id``, the outcome, the reason
    when rejected again, and the call's ``tracked_operation_id`` when the packet names
    one as a GUID (``claimed_call`` when the contract refuses the packet)."""

    id: str
    outcome: ResubmitOutcome
    reason: str | None
    tracked_operation_id: str | None


def received_again(packet: bytes, source: str) -> ReceivedPacket:
    """A kept packet as if it came again from ``source``: parsed by the contract, and a
    row pulled from a site refused when it names another site."""
    received = receive_bytes(packet, source)
    if received.packet is not None and source.startswith(PULLED_FROM):
        reason = foreign_source(received.packet.source_site, source.removeprefix(PULLED_FROM))
        if reason is not None:
            return ReceivedPacket(raw=packet, source=source, rejected_because=reason)
    return received


def resubmit_rejected(
    engine: sa.Engine,
    writer: SiteCallWriter,
    rejected_id: str,
    operator: str,
    *,
    clock: Clock = utc_now,
) -> Resubmission | None:
    """Write the rejected packet ``rejected_id`` again on behalf of ``operator``;
    ``None`` when no rejected packet has that id. Raises what ``writer.write`` raises
    (``IngestBudgetExceeded``, a store error): nothing is changed then."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(rt.packet, rt.source).where(
                rt.id == rejected_id,
                sa.not_(rt.source.startswith(REJECTED_NOTIFICATION_SOURCE, autoescape=True)),
            )
        ).one_or_none()
    if row is None:
        return None  # none, or a notification: it is no telemetry to write
    received = received_again(row.packet, row.source)
    (reason,) = writer.write([received])
    written = None if received.packet is None else received.packet.tracked_operation_id
    outcome = ResubmitOutcome.ACCEPTED if reason is None else ResubmitOutcome.REJECTED
    now = clock()
    with begin_write(engine) as conn:
        if reason is None:
            conn.execute(sa.delete(rejected_telemetry).where(rt.id == rejected_id))
        else:
            conn.execute(
                sa.update(rejected_telemetry).where(rt.id == rejected_id).values(reason=reason)
            )
        _record(conn, rejected_id, operator, outcome, written, now)
    return Resubmission(rejected_id, outcome, reason, written or claimed_call(row.packet))


def claimed_call(packet: bytes) -> str | None:
    """The ``tracked_operation_id`` a packet the contract refuses still claims, as a GUID
    in the contract's lower-case D form, so that an answer names the call as the first
    refusal did; ``None`` when it claims none that reads as a GUID."""
    try:
        data = json.loads(packet)
    except (ValueError, RecursionError):
        return None
    claimed = data.get("tracked_operation_id") if isinstance(data, dict) else None
    if not isinstance(claimed, str):
        return None
    try:
        return str(uuid.UUID(claimed))
    except ValueError:
        return None


def _record(
    conn: sa.Connection,
    rejected_id: str,
    operator: str,
    outcome: ResubmitOutcome,
    tracked_operation_id: str | None,
    now: datetime,
) -> None:
    # A reason may quote the sender's text (an unknown field's name); descriptions quote
    # ids and outcomes only, and the reason stays on the rejected packet.
    result = "accepted" if outcome is ResubmitOutcome.ACCEPTED else "rejected again"
    description = f"{operator} re-submitted rejected telemetry {rejected_id}: {result}"
    record_event(
        conn,
        description=description,
        severity=Severity.INFO if outcome is ResubmitOutcome.ACCEPTED else Severity.WARNING,
        category=Category.SITE_CALLS,
        event_type=EventType.REJECTED_TELEMETRY_RESUBMITTED,
        raised_at=now,
        related_to=[] if tracked_operation_id is None else [f"/site-call/{tracked_operation_id}"],
    )


def purge_rejected(engine: sa.Engine, *, cutoff: datetime, chunk: int) -> int:
    """Delete the rejected packets kept since before ``cutoff`` (UTC), in chunks of
    ``chunk`` rows along ``ix_rejected_telemetry_rejected_at_utc_id``, each its own
    transaction; returns how many."""
    deleted = 0
    while True:
        with begin_write(engine) as conn:
            ids = (
                conn.execute(
                    sa.select(rt.id)
                    .where(rt.rejected_at_utc < cutoff)
                    .order_by(rt.rejected_at_utc, rt.id)
                    .limit(chunk)
                )
                .scalars()
                .all()
            )
            if ids:
                conn.execute(
                    sa.delete(rejected_telemetry).where(rt.id.in_(ids), rt.rejected_at_utc < cutoff)
                )
        deleted += len(ids)
        if len(ids) < chunk:
            return deleted
