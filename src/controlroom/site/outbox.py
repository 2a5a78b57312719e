"""Delivery of the site's outboxes to central, at least once: telemetry and notifications.

Source: docs/design.md "The site agent" (telemetry survives a central outage) and
"Notification outbox". Both senders post batches with the site's central token and take
nothing off the site's store until central answered 2xx for the request that carried it.
Any other answer, a timeout or a refused connection keeps the batch, and the loop backs
off (tenacity's exponential wait) until central answers. Central is idempotent on both:
its upsert of telemetry is order-free, and it stores a notification once per
``notification_id``, so a batch sent again after a crash changes nothing.

- ``OutboxSender``: ``POST /api/site-calls/telemetry`` (a JSON list of packets); a packet
  central rejected is kept whole there (``rejected_telemetry``), so it leaves the outbox
  too.
- ``NotificationForwarder``: ``POST /api/site-notifications`` (a JSON list of
  notifications); central answers which it took and which it refused for good with a
  reason: those are kept at the site as ``Rejected`` with that reason, never sent again.
  A whole request refused with a 4xx that says nothing of the site's token, of load or
  of a missing route (401, 403, 404, 405, 408, 429: kept and sent again) is sent again
  one notification at a time, so only the one at fault is kept as ``Rejected``, with
  central's answer as its reason.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import httpx
import tenacity

from controlroom.exceptions import ControlroomError
from controlroom.site.config import SiteSettings
from controlroom.site.store import TrackingStore

log = logging.getLogger(__name__)

TELEMETRY_PATH = "/api/site-calls/telemetry"
NOTIFICATIONS_PATH = "/api/site-notifications"
_RETRIED_REFUSALS = frozenset({401, 403, 404, 405, 408, 429})
"""4xx answers that say nothing of the notifications sent: the token, the load, or a
central without the intake (older than this agent, or a wrong ``central_url``)."""


class CentralUnavailable(ControlroomError):
    """Central did not take a batch (unreachable, or not a 2xx answer)."""


class _Sender:
    """The loop shared by both senders: ``deliver_once`` until cancelled."""

    what = "telemetry"

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
        raise NotImplementedError

    def _post(self, path: str, items: list[Any]) -> httpx.Response:
        """Post ``items``; raises ``CentralUnavailable`` when central is unreachable."""
        try:
            return self._client.post(path, json=items)
        except httpx.HTTPError as exc:
            raise CentralUnavailable(f"central is unreachable: {exc}") from exc

    async def run(self) -> None:
        """Deliver until cancelled: batch after batch while some wait, a short sleep when
        none does, a growing one while central is down."""
        retrying = tenacity.AsyncRetrying(
            # Central down, or the store busy: keep the batch, back off, never stop.
            retry=tenacity.retry_if_exception_type(Exception),
            wait=tenacity.wait_exponential(multiplier=0.5, max=self._settings.outbox_backoff_cap),
            before_sleep=self._report_outage,
        )
        while True:
            async for attempt in retrying:
                with attempt:
                    sent = await asyncio.to_thread(self.deliver_once)
            if self._down:
                log.warning("%s delivered again; central is back", self.what)
                self._down = False
            if sent < self._settings.outbox_batch:
                await asyncio.sleep(self._settings.outbox_poll)

    def _report_outage(self, state: tenacity.RetryCallState) -> None:
        """Warn once per outage, not once per attempt."""
        if not self._down:
            log.warning(
                "%s not delivered (%s); keeping it and trying again",
                self.what,
                state.outcome.exception() if state.outcome else "?",
            )
            self._down = True


class OutboxSender(_Sender):
    """Sends the telemetry outbox of ``store`` to ``settings.central_url``."""

    def deliver_once(self) -> int:
        """Send one batch of pending packets; returns how many central took (0: none
        pending). Raises ``CentralUnavailable``; the packets stay queued."""
        pending = self._store.pending_packets(self._settings.outbox_batch)
        if not pending:
            return 0
        response = self._post(TELEMETRY_PATH, [packet for _, packet in pending])
        if not response.is_success:
            raise CentralUnavailable(f"central answered {response.status_code}: {response.text}")
        self._store.forget_packets([seq for seq, _ in pending])
        return len(pending)


class NotificationForwarder(_Sender):
    """Forwards the site's ``Pending`` notifications to ``settings.central_url``."""

    what = "notifications"

    def deliver_once(self) -> int:
        """Forward one batch of pending notifications; returns how many central settled
        (took or refused for good; 0: none pending). Raises ``CentralUnavailable``; the
        batch stays ``Pending``."""
        pending = self._store.pending_notifications(self._settings.outbox_batch)
        if not pending:
            return 0
        site = self._settings.site_id
        items = [{**row, "source_site": site} for row in pending]
        response = self._post(NOTIFICATIONS_PATH, items)
        if response.is_client_error and response.status_code not in _RETRIED_REFUSALS:
            if len(items) > 1:
                return sum(self._forward_alone(item) for item in items)
            ids = [item["notification_id"] for item in items]
            self._settle([], dict.fromkeys(ids, _refusal(response)))
            return 1
        if not response.is_success:
            raise CentralUnavailable(f"central answered {response.status_code}: {response.text}")
        answer = response.json()
        refused = {
            items[entry["index"]]["notification_id"]: entry["reason"]
            for entry in answer["rejected"]
        }
        taken = [items[index]["notification_id"] for index in answer["accepted"]]
        self._settle(taken, refused)
        for notification_id, reason in refused.items():
            log.warning("central refused notification %s: %s", notification_id, reason)
        return len(taken) + len(refused)

    def _forward_alone(self, item: dict[str, Any]) -> int:
        response = self._post(NOTIFICATIONS_PATH, [item])
        if response.is_client_error and response.status_code not in _RETRIED_REFUSALS:
            self._settle([], {item["notification_id"]: _refusal(response)})
            return 1
        if not response.is_success:
            raise CentralUnavailable(f"central answered {response.status_code}: {response.text}")
        answer = response.json()
        if answer["rejected"]:
            self._settle([], {item["notification_id"]: answer["rejected"][0]["reason"]})
        else:
            self._settle([item["notification_id"]], {})
        return 1

    def _settle(self, taken: list[str], refused: dict[str, str]) -> None:
        self._store.settle_notifications(taken, refused, datetime.now(UTC))


def _refusal(response: httpx.Response) -> str:
    return f"central answered {response.status_code}: {response.text}"
