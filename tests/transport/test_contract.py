"""The transport contract, run against the embedded queue and against RabbitMQ.

Every test runs once per transport (``transport_factory`` is parametrized) and carries
a hard ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import os
import re

import pytest

from controlroom.transport import (
    DeliveryLostError,
    Transport,
    TransportClosedError,
)
from controlroom.transport.properties import MessageProperties
from tests.transport.helpers import Collector, TransportFactory

pytestmark = pytest.mark.anyio

TIMEOUT = 30  # seconds, per test

HEADERS: dict[str, str | None] = {
    "NServiceBus.MessageId": "5d6b3c1e-0a6f-4a7e-9c1b-b0b1a1f00001",
    "NServiceBus.FailedQ": "Sales@MACHINE",
    "NServiceBus.ExceptionInfo.Message": 'Ünïcødé — ½ 🚀 "quoted" \\ back\nslash',
    "NServiceBus.ExceptionInfo.StackTrace": "at A.B()\r\n   at C.D()\tTAB",
    "NServiceBus.ReplyToAddress": None,
    "Empty": "",
    "日本語の名前": "値",
}


def seq_body(n: int) -> bytes:
    return f"message {n}".encode()


def seq_of(body: bytes) -> int:
    return int(body.decode().split()[1])


async def publish_sequence(transport: Transport, queue: str, count: int) -> None:
    for n in range(count):
        await transport.publish(queue, {"seq": str(n)}, seq_body(n))


class TestTransportContract:
    async def test_round_trip_keeps_headers_and_body_exactly(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        body = os.urandom(1024 * 1024) + b"\x00\xff\xfe"  # 1 MiB of binary, NULs included
        async with asyncio.timeout(TIMEOUT), transport_factory() as transport:
            await transport.publish(queue_name, HEADERS, body)
            async with Collector(transport, queue_name, prefetch=1) as consumer:
                delivery = await consumer.get()
                assert delivery.headers == HEADERS
                assert type(delivery.body) is bytes
                assert delivery.body == body
                assert delivery.queue == queue_name
                await delivery.ack()

    async def test_message_id_property_fills_only_a_missing_header(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        async with asyncio.timeout(TIMEOUT), transport_factory() as transport:
            await transport.publish(queue_name, {"a": "1"}, b"1", message_id="from-property")
            await transport.publish(
                queue_name,
                {"NServiceBus.MessageId": "from-header"},
                b"2",
                message_id="from-property",
                content_type="application/json",
            )
            await transport.publish(queue_name, {"NServiceBus.MessageId": None}, b"3")
            await transport.publish(queue_name, {"a": "4"}, b"4")  # no id anywhere
            async with Collector(transport, queue_name, prefetch=4) as consumer:
                deliveries = await consumer.get_many(4)
                headers = [d.headers for d in deliveries]
                assert headers[0] == {"a": "1", "NServiceBus.MessageId": "from-property"}
                assert headers[1] == {"NServiceBus.MessageId": "from-header"}
                assert headers[2] == {"NServiceBus.MessageId": None}  # present: authoritative
                assert headers[3]["a"] == "4"
                assert re.fullmatch(r"[0-9a-f]{32}", headers[3]["NServiceBus.MessageId"] or "")
                for delivery in deliveries:
                    await delivery.ack()

    async def test_ack_removes_the_message(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        async with asyncio.timeout(TIMEOUT):
            async with transport_factory() as transport:
                await transport.publish(queue_name, {}, b"once")
                async with Collector(transport, queue_name, prefetch=1) as consumer:
                    await (await consumer.get()).ack()
                    await consumer.assert_idle(0.5)
            async with transport_factory() as transport:
                async with Collector(transport, queue_name, prefetch=1) as consumer:
                    await consumer.assert_idle(1.0)
                assert await transport.purge(queue_name) == 0

    async def test_reject_with_requeue_redelivers(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        async with asyncio.timeout(TIMEOUT), transport_factory() as transport:
            await transport.publish(queue_name, {"k": "v"}, b"again")
            async with Collector(transport, queue_name, prefetch=1) as consumer:
                first = await consumer.get()
                await first.reject(requeue=True)
                again = await consumer.get()
                assert again.headers["k"] == "v"
                assert again.headers == first.headers  # the assigned message id included
                assert again.body == b"again"
                await again.ack()
                await consumer.assert_idle(0.5)

    async def test_reject_without_requeue_drops(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        async with asyncio.timeout(TIMEOUT), transport_factory() as transport:
            await transport.publish(queue_name, {}, b"drop me")
            async with Collector(transport, queue_name, prefetch=1) as consumer:
                await (await consumer.get()).reject(requeue=False)
                await consumer.assert_idle(1.0)
            assert await transport.purge(queue_name) == 0

    async def test_unacked_message_comes_back_after_the_consumer_closes(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        async with asyncio.timeout(TIMEOUT):
            first = transport_factory()
            await first.start()
            await first.publish(queue_name, {"k": "v"}, b"unacked")
            async with Collector(first, queue_name, prefetch=5) as consumer:
                held = await consumer.get()
            await first.close()
            with pytest.raises(DeliveryLostError):
                await held.ack()  # too late: it went back to the queue
            assert held.settled

            async with (
                transport_factory() as second,
                Collector(second, queue_name, prefetch=5) as consumer,
            ):
                again = await consumer.get()
                assert (again.headers, again.body) == (held.headers, b"unacked")
                await again.ack()
                await consumer.assert_idle(0.5)

    async def test_fifo_order(self, transport_factory: TransportFactory, queue_name: str) -> None:
        async with asyncio.timeout(TIMEOUT), transport_factory() as transport:
            await publish_sequence(transport, queue_name, 50)
            received = []
            async with Collector(transport, queue_name, prefetch=7) as consumer:
                for _ in range(50):
                    delivery = await consumer.get()
                    received.append(seq_of(delivery.body))
                    await delivery.ack()
            assert received == list(range(50))

    async def test_prefetch_bounds_unsettled_deliveries(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        async with asyncio.timeout(TIMEOUT):
            async with transport_factory() as a, transport_factory() as b:
                await publish_sequence(a, queue_name, 10)
                async with Collector(a, queue_name, prefetch=3) as consumer_a:
                    held = await consumer_a.get_many(3)
                    assert [seq_of(d.body) for d in held] == [0, 1, 2]
                    await consumer_a.assert_idle(0.5)  # three unsettled: no fourth

                    await held[0].ack()
                    fourth = await consumer_a.get()
                    assert seq_of(fourth.body) == 3

                    # A holds 1, 2, 3 and no more: everything else is B's to take.
                    async with Collector(b, queue_name, prefetch=20) as consumer_b:
                        rest = await consumer_b.get_many(6)
                        assert sorted(seq_of(d.body) for d in rest) == list(range(4, 10))
                        await consumer_b.assert_idle(0.5)
                        await consumer_a.assert_idle(0.0)
                        for delivery in [*held[1:], fourth, *rest]:
                            await delivery.ack()

    async def test_yielded_deliveries_stay_settleable_after_the_iterator_ends(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        async with asyncio.timeout(TIMEOUT):
            async with transport_factory() as transport:
                await publish_sequence(transport, queue_name, 3)
                consumer = Collector(transport, queue_name, prefetch=3)
                async with consumer:
                    delivery = await consumer.get()
                await consumer.stop()  # the pipeline stopped pulling; the commit is pending
                await delivery.ack()
            # The two never yielded went back; the acked one is gone.
            async with (
                transport_factory() as transport,
                Collector(transport, queue_name, prefetch=5) as consumer,
            ):
                rest = await consumer.get_many(2)
                assert sorted(seq_of(d.body) for d in rest) == [1, 2]
                for d in rest:
                    await d.ack()
                await consumer.assert_idle(0.5)

    async def test_a_closed_iterator_gives_back_what_it_never_yielded(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        async with (
            asyncio.timeout(TIMEOUT),
            transport_factory() as first,
            transport_factory() as second,
        ):
            await publish_sequence(first, queue_name, 5)
            consumer = first.consume(queue_name, 5)  # all five claimed / pushed at once
            held = await anext(consumer)
            await asyncio.sleep(0.2)  # let the broker push the rest
            await consumer.aclose()  # type: ignore[attr-defined]
            # Back at once (not after a lease), while `first` still holds the one yielded.
            async with Collector(second, queue_name, prefetch=10) as other:
                rest = await other.get_many(4, timeout=10)
                assert sorted(seq_of(d.body) for d in rest) == [1, 2, 3, 4]
                await other.assert_idle(0.3)
                for delivery in [held, *rest]:
                    await delivery.ack()

    async def test_a_delivery_settles_once(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        async with asyncio.timeout(TIMEOUT), transport_factory() as transport:
            await transport.publish(queue_name, {}, b"x")
            async with Collector(transport, queue_name, prefetch=1) as consumer:
                delivery = await consumer.get()
                await delivery.ack()
                with pytest.raises(RuntimeError, match="already settled"):
                    await delivery.reject(requeue=True)

    async def test_close_ends_an_idle_consumer(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        async with asyncio.timeout(TIMEOUT):
            transport = transport_factory()
            await transport.start()
            consumer = Collector(transport, queue_name, prefetch=1)
            async with consumer:
                await asyncio.sleep(0.3)  # let it start and go idle
                await transport.close()
                while not consumer.done:
                    await asyncio.sleep(0.05)

    async def test_check_and_use_after_close(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        async with asyncio.timeout(TIMEOUT):
            transport = transport_factory()
            with pytest.raises(TransportClosedError):
                await transport.check()  # not started
            await transport.start()
            await transport.check()
            await transport.close()
            await transport.close()  # idempotent
            with pytest.raises(TransportClosedError):
                await transport.check()
            with pytest.raises(TransportClosedError):
                await transport.publish(queue_name, {}, b"late")

    async def test_purge_removes_ready_messages(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        async with asyncio.timeout(TIMEOUT), transport_factory() as transport:
            await publish_sequence(transport, queue_name, 4)
            assert await transport.purge(queue_name) == 4
            assert await transport.purge(queue_name) == 0

    async def test_bad_input_is_refused_with_a_clear_error(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        async with asyncio.timeout(TIMEOUT), transport_factory() as transport:
            with pytest.raises(ValueError, match="'count'"):
                await transport.publish(queue_name, {"count": 3}, b"x")  # type: ignore[dict-item]
            with pytest.raises(ValueError, match="'bad'"):
                await transport.publish(queue_name, {"bad": "\ud800"}, b"x")
            with pytest.raises(ValueError, match="queue name"):
                await transport.publish("", {}, b"x")
            with pytest.raises(ValueError, match="bytes"):
                await transport.publish(queue_name, {}, "text")  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="prefetch"):
                await anext(aiter(transport.consume(queue_name, 0)))
            assert await transport.purge(queue_name) == 0


class TestTaskMessageProperties:
    """A Python task's message keeps its broker properties and typed header table on
    either transport (docs/design.md "Python task queues")."""

    async def test_properties_and_typed_headers_come_back_as_published(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        typed = {
            "task": "shop.tasks.charge",
            "retries": 2,
            "timelimit": [None, 30],
            "stamps": {"a": [1, "b"]},
            "ignore_result": False,
            "shadow": None,
        }
        sent = MessageProperties(
            content_encoding="utf-8",
            correlation_id="3f1e0c9a-task",
            reply_to="reply-queue",
            priority=7,
            headers=typed,
        )
        async with asyncio.timeout(TIMEOUT), transport_factory() as transport:
            await transport.publish(
                queue_name,
                {"plain": "text", "retries": "overridden by the typed table"},
                b"[[1], {}, {}]",
                message_id="3f1e0c9a-task",
                content_type="application/json",
                properties=sent,
            )
            async with Collector(transport, queue_name, prefetch=1) as consumer:
                delivery = await consumer.get()
                await delivery.ack()
        received = delivery.properties
        assert received is not None
        assert received.content_encoding == "utf-8"
        assert received.correlation_id == "3f1e0c9a-task"
        assert received.reply_to == "reply-queue"
        assert received.priority == 7
        assert received.headers is not None
        assert {name: received.headers[name] for name in typed} == typed
        assert received.headers["plain"] == "text"
        # the string view every consumer reads, the same on both transports
        assert delivery.headers["retries"] == "2"
        assert delivery.headers["timelimit"] == "[null,30]"
        assert delivery.headers["shadow"] is None
        assert delivery.headers["NServiceBus.MessageId"] == "3f1e0c9a-task"
        assert delivery.body == b"[[1], {}, {}]"

    async def test_a_header_no_transport_can_carry_is_refused(
        self, transport_factory: TransportFactory, queue_name: str
    ) -> None:
        async with asyncio.timeout(TIMEOUT), transport_factory() as transport:
            with pytest.raises(ValueError, match="set"):
                await transport.publish(
                    queue_name, {}, b"", properties=MessageProperties(headers={"x": {1, 2}})
                )
