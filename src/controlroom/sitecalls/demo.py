"""Realistic site-call telemetry for ``controlroom demo``: three sites of two nodes each
making cached calls that deliver, retry, park, fail, are retried or discarded by an
operator, or are still pending (some long enough to be stuck), with audit events.

Delivery is at least once and out of order, as from real sites: about one packet in ten
is sent twice and neighbouring packets are sometimes swapped; the monotonic upsert makes
the mirror come out the same. Deterministic for a given ``seed`` and ``now``.
"""

from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta
from typing import Any

SITES: dict[str, tuple[str, str]] = {
    "plant-north": ("north-gw-1", "north-gw-2"),
    "plant-south": ("south-gw-1", "south-gw-2"),
    "depot-east": ("east-gw-1", "east-gw-2"),
}
API_TARGETS = (
    "https://erp.example.com/api/orders",
    "https://erp.example.com/api/shipments",
    "https://billing.example.com/v2/invoices",
)
DB_TARGETS = ("central.dbo.ProductionCounts", "central.dbo.QualityResults")
SCENARIOS = ("deliver", "retry", "park", "fail", "operator-retry", "discard", "pending", "stuck")
DEFAULT_CALLS = 36
MIN_CALLS = len(SCENARIOS)


class _Call:
    """One cached call's packets as its site emits them."""

    def __init__(self, rng: random.Random, now: datetime) -> None:
        self.rng = rng
        self.site = rng.choice(list(SITES))
        self.node = rng.choice(SITES[self.site])
        self.channel = "ApiOutbound" if rng.random() < 0.7 else "DbOutbound"
        self.target = rng.choice(API_TARGETS if self.channel == "ApiOutbound" else DB_TARGETS)
        self.id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        self.created = now - timedelta(seconds=rng.randint(60, 3 * 3600))
        self.at = self.created
        self.epoch = 0
        self.retries = 0
        self.packets: list[dict[str, Any]] = []

    def emit(
        self,
        status: str,
        *,
        error: str | None = None,
        http: int | None = None,
        actor: str | None = None,
        action: str | None = None,
        outcome: str = "Success",
        category: str = "CachedCall",
        step: tuple[int, int] = (1, 40),
    ) -> None:
        self.at += timedelta(seconds=self.rng.randint(*step))
        terminal = status in ("Delivered", "Failed", "Discarded")
        packet: dict[str, Any] = {
            "tracked_operation_id": self.id,
            "channel": self.channel,
            "target": self.target,
            "source_site": self.site,
            "source_node": self.node,
            "status": status,
            "retry_count": self.retries,
            "last_error": error,
            "http_status": http if self.channel == "ApiOutbound" else None,
            "created_at_utc": self.created.isoformat(),
            "updated_at_utc": self.at.isoformat(),
            "terminal_at_utc": self.at.isoformat() if terminal else None,
            "epoch": self.epoch,
        }
        if action is not None:
            packet["audit_event"] = {
                "event_id": str(uuid.UUID(int=self.rng.getrandbits(128), version=4)),
                "occurred_at_utc": self.at.isoformat(),
                "actor": actor or f"{self.site}/{self.node}",
                "action": action,
                "outcome": outcome,
                "category": category,
                "target": self.target,
                "source_node": self.node,
                "correlation_id": self.id,
                "details_json": None if error is None else f'{{"error": "{error}"}}',
            }
        self.packets.append(packet)

    def start(self) -> None:
        self.emit("Submitted", action="CallSubmitted")
        self.emit("Forwarded")

    def attempt_failing(self, times: int, http: int = 503) -> None:
        for _ in range(times):
            self.retries += 1
            status = "Skipped" if self.rng.random() < 0.2 else "Attempted"
            error = "circuit open" if status == "Skipped" else f"HTTP {http} Service Unavailable"
            self.emit(
                status, error=error, http=None if status == "Skipped" else http, step=(5, 120)
            )

    def park(self) -> None:
        self.attempt_failing(3)
        self.emit(
            "Parked", error="retries exhausted", http=503, action="CallParked", outcome="Failure"
        )


def _scenario(call: _Call, name: str, now: datetime) -> None:
    if name == "pending":  # recent: still moving, not stuck
        call.created = call.at = now - timedelta(seconds=call.rng.randint(5, 120))
    call.start()
    if name == "deliver":
        call.emit("Delivered", http=200, action="CallDelivered")
    elif name == "retry":
        call.attempt_failing(call.rng.randint(1, 3))
        call.emit("Delivered", http=200, action="CallDelivered")
    elif name == "park":
        call.park()
    elif name == "fail":
        call.retries += 1
        call.emit(
            "Failed",
            error="HTTP 400 Bad Request: unknown order",
            http=400,
            action="CallFailed",
            outcome="Failure",
        )
    elif name == "operator-retry":
        call.park()
        call.epoch += 1  # the site starts a new lifecycle when an operator retries
        call.retries = 0
        call.emit(
            "Submitted",
            actor="operator:alice",
            action="RetryParkedCall",
            category="OperatorAction",
            step=(60, 300),
        )
        call.emit("Forwarded")
        call.emit("Delivered", http=200, action="CallDelivered")
    elif name == "discard":
        call.park()
        call.emit(
            "Discarded",
            actor="operator:alice",
            action="DiscardParkedCall",
            category="OperatorAction",
            step=(60, 300),
        )
    elif name == "stuck":
        call.attempt_failing(1)
    for packet in call.packets:  # nothing from the future
        for key in ("updated_at_utc", "terminal_at_utc"):
            if packet.get(key) and datetime.fromisoformat(packet[key]) > now:
                packet[key] = now.isoformat()
        event = packet.get("audit_event")
        if event and datetime.fromisoformat(event["occurred_at_utc"]) > now:
            event["occurred_at_utc"] = now.isoformat()


def generate_demo_telemetry(
    calls: int = DEFAULT_CALLS, *, seed: int, now: datetime
) -> list[dict[str, Any]]:
    """Telemetry packets of ``calls`` cached calls (one of each scenario first), in the
    order a set of sites would deliver them. Raises ``ValueError`` below ``MIN_CALLS``."""
    if calls < MIN_CALLS:
        raise ValueError(f"calls must be at least {MIN_CALLS} (one of each scenario)")
    rng = random.Random(seed)
    packets: list[dict[str, Any]] = []
    for index in range(calls):
        name = SCENARIOS[index] if index < len(SCENARIOS) else rng.choice(SCENARIOS)
        call = _Call(rng, now)
        _scenario(call, name, now)
        packets.extend(call.packets)
    packets.sort(key=lambda p: p["updated_at_utc"])
    for i in range(len(packets) - 1):  # out of order now and then
        if rng.random() < 0.1:
            packets[i], packets[i + 1] = packets[i + 1], packets[i]
    duplicates = [p for p in packets if rng.random() < 0.1]  # at least once
    for packet in duplicates:
        packets.insert(rng.randrange(len(packets) + 1), packet)
    return packets
