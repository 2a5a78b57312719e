"""The dispatcher: a periodic part of ``serve`` that sends due notifications
(docs/design.md "Notification outbox").

Each run claims due rows (``store.claim_due``, ``batch_size`` at a time) and sends them,
at most ``concurrency`` at once, each bounded by ``send_timeout``, outside any database
transaction; each outcome is written with ``store.record_attempt``. A send slot that
frees takes the next claimed notification at once, and the next claim is made, while
the other sends go on, as soon as fewer claimed notifications wait than there are
slots: a send that hangs until its timeout holds up its own slot only, never a batch
(docs/design.md "Notification outbox"). A run goes on claiming while claims come back
full. Where the provider lets several processes claim at once
(``Provider.claims_rows_concurrently``) every ``serve`` dispatches; elsewhere one does,
under the ``notification dispatch`` lease. A failed run (the database unreachable)
makes the next wait longer, doubling up to ``ingestion.max_backoff_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Mapping
from datetime import UTC, timedelta

import httpx
import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.providers import provider_for
from controlroom.notifications.channels import Sender, SmtpSender, WebhookSender
from controlroom.notifications.lifecycle import (
    Attempt,
    Channel,
    Next,
    Policy,
    Status,
    Verdict,
    after_attempt,
)
from controlroom.notifications.rules import count_group_failures
from controlroom.notifications.store import Claimed, SendableTargets, claim_due, record_attempt
from controlroom.runtime.clock import Clock, utc_now
from controlroom.runtime.periodic import PeriodicTask

log = logging.getLogger(__name__)

LEASE = "notification dispatch"


def attempt_outcome(attempt: Attempt, after: Next) -> str:
    """How the log words an attempt's outcome: ``delivered, now Delivered``; a failed
    attempt ``failed, retrying at <when>`` while the notification retries, else ``failed,
    now <status>`` (the attempt that parks or fails it is no retry)."""
    if attempt.verdict is Verdict.DELIVERED:
        return f"delivered, now {after.status}"
    if after.status is Status.RETRYING and after.next_attempt_at is not None:
        when = after.next_attempt_at.astimezone(UTC).isoformat(timespec="seconds")
        return f"failed, retrying at {when}"
    return f"failed, now {after.status}"


class Dispatcher:
    """Sends due notifications on a schedule (module docstring). ``senders`` replaces the
    channels' senders (by channel name); by default a webhook and an SMTP sender."""

    def __init__(
        self,
        settings: Settings,
        engine: sa.Engine,
        *,
        owner: str,
        senders: Mapping[str, Sender] | None = None,
        clock: Clock = utc_now,
        rng: random.Random | None = None,
    ) -> None:
        outbox = settings.notifications
        self._settings = outbox
        self._engine = engine
        self._senders = senders
        self._clock = clock
        self._rng = rng or random.Random()
        self._sendable = SendableTargets(
            webhooks=frozenset(hook.name for hook in outbox.webhooks),
            recipient_lists=frozenset(entry.name for entry in outbox.recipient_lists),
            smtp=outbox.smtp is not None,
        )
        self._policy = Policy(
            max_attempts=outbox.max_attempts,
            base=outbox.backoff_base.total_seconds(),
            cap=outbox.backoff_cap.total_seconds(),
            retry_after_cap=outbox.retry_after_cap.total_seconds(),
        )
        provider = provider_for(engine)
        lease = (
            None
            if provider.claims_rows_concurrently
            else provider.make_lease(engine, LEASE, owner, outbox.claim_seconds)
        )
        self.task = PeriodicTask(
            "notification dispatch",
            self.dispatch,
            interval=outbox.dispatch_interval_seconds,
            jitter=0.2,
            lease=lease,
            max_backoff=settings.ingestion.max_backoff_seconds,
        )
        self._active: Mapping[str, Sender] = senders or {}

    async def run(self) -> None:
        """Dispatch on the schedule until cancelled."""
        if self._senders is not None:
            await self.task.run()
            return
        async with httpx.AsyncClient(
            timeout=self._settings.send_timeout, follow_redirects=False
        ) as client:
            self._active = {
                Channel.WEBHOOK: WebhookSender(self._settings, client, self._clock),
                Channel.EMAIL: SmtpSender(self._settings, self._settings.send_timeout, self._clock),
            }
            await self.task.run()

    async def dispatch(self) -> int:
        """Claim and send until nothing is due (or the task stops); answers how many
        notifications were attempted (module docstring). A failed outcome write ends the
        run with its error once the sends under way have ended; the notifications still
        waiting keep their claim and are due again when it lapses."""
        if not self._active:
            raise RuntimeError("the dispatcher sends only while it runs, or with its senders")
        slots = self._settings.concurrency
        waiting: deque[Claimed] = deque()
        sending: set[asyncio.Task[None]] = set()
        attempted = 0
        drained = False
        try:
            while True:
                while waiting and len(sending) < slots:
                    sending.add(asyncio.create_task(self._deliver(waiting.popleft())))
                if not drained and len(waiting) < slots and not self.task.stopping.is_set():
                    claimed = await asyncio.to_thread(
                        claim_due,
                        self._engine,
                        now=self._clock(),
                        limit=self._settings.batch_size,
                        claim_for=timedelta(seconds=self._settings.claim_seconds),
                        sendable=self._sendable,
                    )
                    attempted += len(claimed)
                    waiting.extend(claimed)
                    drained = len(claimed) < self._settings.batch_size
                    continue
                if not sending:  # and so nothing waits either
                    return attempted
                done, sending = await asyncio.wait(sending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()
        except asyncio.CancelledError:
            for task in sending:
                task.cancel()
            raise
        except Exception:
            await asyncio.gather(*sending, return_exceptions=True)
            raise

    async def _deliver(self, claimed: Claimed) -> None:
        if claimed.failure_groups is not None:  # a rule's count, made at its first claim
            claimed = await asyncio.to_thread(
                count_group_failures, self._engine, claimed, now=self._clock()
            )
        attempt = await self._attempt(claimed)
        after = after_attempt(claimed.retry_count, attempt, self._clock(), self._policy, self._rng)
        if attempt.verdict is Verdict.CONFIGURATION:
            log.error(
                "notification %s parked: a configuration error (%s)",
                claimed.notification_id,
                attempt.error,
            )
        await asyncio.to_thread(
            record_attempt, self._engine, claimed, attempt, after, now=self._clock()
        )
        # One line per attempt: the notification's row keeps the latest outcome only
        # (docs/decisions.md "A notification keeps its latest attempt, the log each one").
        log.info(
            "notification %s (%s to %s): attempt %d %s%s",
            claimed.notification_id,
            claimed.channel,
            claimed.target,
            claimed.retry_count + 1,
            attempt_outcome(attempt, after),
            "" if attempt.error is None else f": {attempt.error}",
        )

    async def _attempt(self, claimed: Claimed) -> Attempt:
        sender = self._active.get(claimed.channel)
        if sender is None:
            return Attempt(Verdict.PERMANENT, f"no sender for channel {claimed.channel!r}")
        timeout = self._settings.send_timeout
        try:
            async with asyncio.timeout(timeout):
                return await sender.send(claimed)
        except TimeoutError:
            return Attempt(Verdict.RETRY, f"the send took longer than {timeout:g} s")
        except Exception as exc:
            log.warning("notification %s: the send failed", claimed.notification_id, exc_info=True)
            return Attempt(Verdict.RETRY, f"{type(exc).__name__}: {exc}")
