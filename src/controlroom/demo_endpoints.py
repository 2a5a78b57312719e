"""The demo's endpoints, for ``controlroom demo endpoints``: consumers of retried messages.

An operator's retry sends a failed message back to the queue it failed in; the endpoint
that reads that queue processes it again. ``DemoEndpoints`` plays the endpoints of
``controlroom demo`` (the queues of ``demo.demo_endpoint_queues``: Sales, Billing, ...)
as an NServiceBus endpoint would, using only ``controlroom.client``. For each message:

* processed: it confirms the retry (``client.confirm_successful_retry``: NServiceBus's
  ``RetryAcknowledgementBehavior`` sends a control message with
  ``ServiceControl.Retry.Successful`` and ``ServiceControl.Retry.UniqueMessageId`` to the
  queue named by ``ServiceControl.Retry.AcknowledgementQueue``), and ingestion marks the
  failed message Resolved;
* failed again: it moves the message to the error queue with the failure headers
  (``demo.failed_again_headers``; the retry headers stay), and ingestion folds the new
  attempt into the same failed message: Unresolved again, one more attempt;

then acknowledges the message. Which retries fail again is a seeded draw per message and
per delivery (``fails_again``): the same seed fails the same messages, and a message
retried once more gets a fresh draw. A message that is not a retry is only acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from controlroom.client import confirm_successful_retry, publish_failed_message
from controlroom.demo import demo_endpoint_queues, failed_again_headers
from controlroom.demo_sizes import DEFAULT_FAIL_RATIO
from controlroom.errors.ingest import headers as h
from controlroom.transport import Delivery, DeliveryLostError, Transport, TransportError

log = logging.getLogger(__name__)

PREFETCH = 10


class Outcome(enum.StrEnum):
    """What a demo endpoint did with one message."""

    CONFIRMED = "confirmed"  # processed; the retry confirmed to Controlroom
    FAILED_AGAIN = "failed again"  # moved to the error queue as a new attempt
    NOT_A_RETRY = "not a retry"  # processed; nothing to confirm


@dataclass(frozen=True, slots=True)
class Handled:
    """One message a demo endpoint took from ``queue``: the failed message it is a retry of
    (``None`` for a message that is not a retry), its message type, and the outcome."""

    queue: str
    unique_message_id: str | None
    message_type: str | None
    outcome: Outcome


def fails_again(seed: int, unique_message_id: str, delivery_number: int, ratio: float) -> bool:
    """Whether the ``delivery_number``-th delivery (1 for the first) of a retry of
    ``unique_message_id`` fails again: a draw in [0, 1) seeded by the three, below
    ``ratio`` (0: never, 1: always). Pure and deterministic."""
    return random.Random(f"{seed}/{unique_message_id}/{delivery_number}").random() < ratio


class DemoEndpoints:
    """Consumes ``queues`` (default: every demo endpoint's) on ``transport`` and handles
    each message as the module docstring says, until ``run`` is cancelled.

    ``error_queue``: where a message that failed again goes (the endpoints' error queue,
    Controlroom's). ``seed`` and ``fail_ratio`` (0 to 1) choose which fail again
    (``fails_again``). ``on_handled`` is called with each ``Handled`` after the message
    was acknowledged. ``clock`` gives the time of a new failure (aware, UTC).
    Raises ``ValueError`` for a ratio outside [0, 1] or a queue no demo endpoint reads.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        error_queue: str,
        seed: int,
        fail_ratio: float = DEFAULT_FAIL_RATIO,
        queues: Sequence[str] | None = None,
        on_handled: Callable[[Handled], None] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not 0 <= fail_ratio <= 1:
            raise ValueError(f"fail_ratio must be between 0 and 1, got {fail_ratio!r}")
        known = demo_endpoint_queues()
        self._queues = tuple(queues) if queues is not None else known
        unknown = [queue for queue in self._queues if queue not in known]
        if unknown:
            raise ValueError(f"no demo endpoint reads queue {unknown[0]!r}")
        self._transport = transport
        self._error_queue = error_queue
        self._seed = seed
        self._fail_ratio = fail_ratio
        self._on_handled = on_handled
        self._clock = clock
        self._deliveries: Counter[str] = Counter()  # per failed message: retries seen

    async def run(self) -> None:
        """Consume every queue until cancelled or the transport closes.

        Raises ``TransportError`` when a queue cannot be consumed or a confirmation or
        failure cannot be sent (that message is given back to its queue first).
        """
        async with asyncio.TaskGroup() as group:
            for queue in self._queues:
                group.create_task(self._consume(queue), name=f"demo endpoint {queue}")

    async def _consume(self, queue: str) -> None:
        stream = self._transport.consume(queue, PREFETCH)
        async with contextlib.aclosing(stream):
            async for delivery in stream:
                handled = await self.handle(delivery)
                if handled is not None and self._on_handled is not None:
                    self._on_handled(handled)

    async def handle(self, delivery: Delivery) -> Handled | None:
        """Process one message, send its confirmation or its failure, acknowledge it.

        Returns what was done, or ``None`` when the acknowledgement was lost (the message
        comes back and is handled again, as on any at-least-once transport).
        Raises ``TransportError`` after giving the message back when a send failed.
        """
        try:
            outcome = await self._process(delivery)
        except Exception:
            with contextlib.suppress(TransportError):
                await delivery.reject(requeue=True)
            raise
        try:
            await delivery.ack()
        except DeliveryLostError:
            log.warning("a message of queue %s comes again: its delivery was lost", delivery.queue)
            return None
        return Handled(
            queue=delivery.queue,
            unique_message_id=h.retry_unique_message_id(delivery.headers),
            message_type=h.message_type(delivery.headers),
            outcome=outcome,
        )

    async def _process(self, delivery: Delivery) -> Outcome:
        unique_message_id = h.retry_unique_message_id(delivery.headers)
        if unique_message_id is None:
            return Outcome.NOT_A_RETRY
        self._deliveries[unique_message_id] += 1
        seen = self._deliveries[unique_message_id]
        if fails_again(self._seed, unique_message_id, seen, self._fail_ratio):
            headers = failed_again_headers(delivery.queue, delivery.headers, now=self._clock())
            await publish_failed_message(
                self._transport, headers, delivery.body, error_queue=self._error_queue
            )
            return Outcome.FAILED_AGAIN
        if await confirm_successful_retry(self._transport, delivery.headers):
            return Outcome.CONFIRMED
        return Outcome.NOT_A_RETRY  # no acknowledgement queue: nowhere to confirm to
