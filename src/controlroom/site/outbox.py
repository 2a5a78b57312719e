"""Delivery of the telemetry outbox to central, at least once.

Source: docs/design.md "The site agent" (telemetry survives a central outage) and central's
intake ``POST /api/site-calls/telemetry`` (a JSON list of packets). Packets leave the
outbox only after central answered 2xx for the request that carried them: a packet central
rejected is kept whole there (``rejected_telemetry``), so it is not sent again either. Any
other answer, a timeout or a refused connection keeps them, and the loop backs off
(tenacity's exponential wait) until central answers. Central's upsert is idempotent and
order-free, so a packet delivered twice or late changes nothing.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import tenacity

from controlroom.exceptions import ControlroomError
from controlroom.site.config import SiteSettings
from controlroom.site.store import TrackingStore

log = logging.getLogger(__name__)

TELEMETRY_PATH = "/api/site-calls/telemetry"


class CentralUnavailable(ControlroomError):
    """Central did not take a batch of telemetry (unreachable, or not a 2xx answer)."""


class OutboxSender:
    """Sends the outbox of ``store`` to ``settings.central_url``."""

    def __init__(self, store: TrackingStore, settings: SiteSettings) -> None:
        self._store = store
        self._settings = settings
        self._down = False
        headers = {}
        if settings.central_token is not None:
            headers["Authorization"] = f"Bearer {settings.central_token.get_secret_value()}"
        self._client = httpx.Client(
            base_url=settings.central_url, headers=headers, timeout=settings.attempt_timeout
        )

    def close(self) -> None:
        self._client.close()

    def deliver_once(self) -> int:
        """Send one batch of pending packets; returns how many central took (0: none
        pending). Raises ``CentralUnavailable``; the packets stay queued."""
        pending = self._store.pending_packets(self._settings.outbox_batch)
        if not pending:
            return 0
        try:
            response = self._client.post(TELEMETRY_PATH, json=[packet for _, packet in pending])
        except httpx.HTTPError as exc:
            raise CentralUnavailable(f"central is unreachable: {exc}") from exc
        if not response.is_success:
            raise CentralUnavailable(f"central answered {response.status_code}: {response.text}")
        self._store.forget_packets([seq for seq, _ in pending])
        return len(pending)

    async def run(self) -> None:
        """Deliver until cancelled: batch after batch while packets wait, a short sleep
        when the outbox is empty, a growing one while central is down."""
        retrying = tenacity.AsyncRetrying(
            # Central down, or the store busy: keep the packets, back off, never stop.
            retry=tenacity.retry_if_exception_type(Exception),
            wait=tenacity.wait_exponential(multiplier=0.5, max=self._settings.outbox_backoff_cap),
            before_sleep=self._report_outage,
        )
        while True:
            async for attempt in retrying:
                with attempt:
                    sent = await asyncio.to_thread(self.deliver_once)
            if self._down:
                log.warning("telemetry delivered again; central is back")
                self._down = False
            if sent < self._settings.outbox_batch:
                await asyncio.sleep(self._settings.outbox_poll)

    def _report_outage(self, state: tenacity.RetryCallState) -> None:
        """Warn once per outage, not once per attempt."""
        if not self._down:
            log.warning(
                "telemetry not delivered (%s); keeping it and trying again",
                state.outcome.exception() if state.outcome else "?",
            )
            self._down = True
