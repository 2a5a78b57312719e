"""Telemetry packets for tests: a lifecycle of one cached call, and packet dicts."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from controlroom.db.tables import site_calls
from controlroom.sitecalls.writer import ReceivedPacket, SiteCallWriter
from controlroom.telemetry.contract import validate_packet
from controlroom.telemetry.ordering import TERMINAL, SiteCallStatus
from controlroom.telemetry.stamps import Stamp

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def packet(
    status: str,
    *,
    op_id: str = "0f8fad5b-d9cb-469f-a165-70867728950e",
    at: datetime | Stamp = T0,
    epoch: int = 0,
    retry_count: int = 0,
    event_id: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A packet dict for ``op_id`` in ``status`` last updated ``at``."""
    data: dict[str, Any] = {
        "tracked_operation_id": op_id,
        "channel": "ApiOutbound",
        "target": "https://erp.example/api/orders",
        "source_site": "site-a",
        "source_node": "node-1",
        "status": status,
        "retry_count": retry_count,
        "last_error": None,
        "http_status": None,
        "created_at_utc": T0.isoformat(),
        "updated_at_utc": at.isoformat(),
        "terminal_at_utc": at.isoformat() if SiteCallStatus(status) in TERMINAL else None,
        "epoch": epoch,
    }
    if event_id is not None:
        data["audit_event"] = {
            "event_id": event_id,
            "occurred_at_utc": at.isoformat(),
            "actor": "site-a/node-1",
            "action": f"Call{status}",
            "outcome": "Failure" if status == "Failed" else "Success",
            "category": "CachedCall",
            "target": data["target"],
        }
    data.update(fields)
    return data


def received(data: dict[str, Any], source: str = "test") -> ReceivedPacket:
    from controlroom.sitecalls.intake import receive_json

    return receive_json(data, source)


def write(writer: SiteCallWriter, *packets: dict[str, Any]) -> list[str | None]:
    return writer.write([received(p) for p in packets])


def stored(engine: sa.Engine, op_id: str = "0f8fad5b-d9cb-469f-a165-70867728950e") -> Any:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(site_calls).where(site_calls.c.tracked_operation_id == op_id)
        ).one_or_none()


def lifecycle(
    op_id: str, *, epochs: int = 1, retries: int = 2, end: str = "Delivered"
) -> list[dict[str, Any]]:
    """A real lifecycle in order: Submitted, Forwarded, Attempted x retries, then Parked
    and a new epoch per extra epoch, and finally ``end``."""
    packets = []
    at = T0
    for epoch in range(epochs):
        for status in ("Submitted", "Forwarded"):
            at += timedelta(seconds=1)
            packets.append(
                packet(status, op_id=op_id, at=at, epoch=epoch, event_id=str(uuid.uuid4()))
            )
        for attempt in range(retries):
            at += timedelta(seconds=1)
            packets.append(
                packet(
                    "Attempted",
                    op_id=op_id,
                    at=at,
                    epoch=epoch,
                    retry_count=attempt + 1,
                    last_error=f"HTTP 503 (attempt {attempt + 1})",
                    http_status=503,
                )
            )
        at += timedelta(seconds=1)
        final = "Parked" if epoch < epochs - 1 else end
        packets.append(
            packet(
                final,
                op_id=op_id,
                at=at,
                epoch=epoch,
                retry_count=retries,
                event_id=str(uuid.uuid4()),
            )
        )
    return packets


def validated(data: dict[str, Any]) -> Any:
    return validate_packet(data)
