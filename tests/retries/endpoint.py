"""A real consumer for the retry tests: an endpoint that fails messages like NServiceBus.

``FlakyEndpoint`` consumes its input queue. The first ``fail_times`` times it sees a
message (by ``NServiceBus.MessageId``) it "fails" it as NServiceBus recoverability does:
the message, with its headers plus the failure headers, goes to the error queue. After
that it processes the message: it records what it received and confirms the retry with
``controlroom.client.confirm_successful_retry`` before acknowledging.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from controlroom.client import confirm_successful_retry
from controlroom.transport.base import Delivery, Transport
from tests.nsb import HOST_ID, nsb_time

MACHINE = "SALES-VM01"


def producer_headers(message_id: str, *, content_type: str) -> dict[str, str | None]:
    """The headers an NServiceBus sender puts on a message (v8 style)."""
    return {
        "NServiceBus.MessageId": message_id,
        "NServiceBus.MessageIntent": "Send",
        "NServiceBus.ConversationId": "be6afcc4-3295-4b6c-8d2f-b43b016c458b",
        "NServiceBus.CorrelationId": message_id,
        "NServiceBus.ContentType": content_type,
        "NServiceBus.EnclosedMessageTypes": "Shop.Messages.PlaceOrder, Shop.Messages, "
        "Version=1.0.0.0, Culture=neutral, PublicKeyToken=null",
        "NServiceBus.OriginatingEndpoint": "WebShop",
        "NServiceBus.OriginatingMachine": "WEBHOST",
        "NServiceBus.ReplyToAddress": "WebShop",
        "NServiceBus.TimeSent": nsb_time(datetime.now(UTC)),
        "NServiceBus.Version": "8.2.5",
        "$.diagnostics.originating.hostid": "7f787fc8e0611a3fab8a93c8767f6639",
        "Shop.TenantId": "tenant-42",
    }


def failure_headers(endpoint: str, address: str, attempt: int) -> dict[str, str | None]:
    """What NServiceBus adds when it moves a message to the error queue."""
    return {
        "NServiceBus.FailedQ": address,
        "NServiceBus.TimeOfFailure": nsb_time(datetime.now(UTC)),
        "NServiceBus.ProcessingEndpoint": endpoint,
        "NServiceBus.ProcessingMachine": MACHINE,
        "$.diagnostics.hostid": HOST_ID,
        "$.diagnostics.hostdisplayname": MACHINE,
        "NServiceBus.ExceptionInfo.ExceptionType": "System.InvalidOperationException",
        "NServiceBus.ExceptionInfo.Message": f"The order could not be placed (attempt {attempt}).",
        "NServiceBus.ExceptionInfo.Source": "Shop.Sales",
        "NServiceBus.ExceptionInfo.StackTrace": "System.InvalidOperationException: no\n"
        "   at Shop.Sales.PlaceOrderHandler.Handle(PlaceOrder message)",
        "NServiceBus.ExceptionInfo.HelpLink": None,
        "NServiceBus.Retries": "2",
        "NServiceBus.Retries.Timestamp": nsb_time(datetime.now(UTC)),
    }


@dataclass
class FlakyEndpoint:
    """An endpoint consuming ``queue`` on ``transport`` (see the module docstring).

    ``address`` is what it writes into ``NServiceBus.FailedQ`` (``queue@machine`` style
    is allowed: Controlroom sends retries to the part before ``@``).
    """

    transport: Transport
    queue: str
    error_queue: str
    address: str
    fail_times: int = 1
    failures: list[tuple[dict[str, str | None], bytes]] = field(default_factory=list)
    processed: list[Delivery] = field(default_factory=list)
    confirmed: list[bool] = field(default_factory=list)
    _seen: Counter[str] = field(default_factory=Counter)
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> FlakyEndpoint:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        consumer = self.transport.consume(self.queue, 20)
        async with contextlib.aclosing(consumer):  # type: ignore[type-var]
            async for delivery in consumer:
                await self._handle(delivery)

    async def _handle(self, delivery: Delivery) -> None:
        message_id = delivery.headers["NServiceBus.MessageId"] or ""
        self._seen[message_id] += 1
        if self._seen[message_id] <= self.fail_times:
            headers = {
                **delivery.headers,
                **failure_headers(self.queue, self.address, self._seen[message_id]),
            }
            await self.transport.publish(self.error_queue, headers, delivery.body)
            self.failures.append((headers, delivery.body))
        else:
            self.processed.append(delivery)
            self.confirmed.append(await confirm_successful_retry(self.transport, delivery.headers))
        await delivery.ack()
