"""docs/decisions.md "Headers that are not UTF-8 make a failed import", on a real RabbitMQ,
per provider: a message whose header name (or AMQP
``message_id``) is not UTF-8, published as a raw AMQP frame, becomes a failed import kept
whole and the messages behind it are ingested; a header name over 128 bytes is refused
before anything is sent."""

from __future__ import annotations

import asyncio
import json
import struct
import uuid
from typing import Any

import aiormq
import pamqp.encode
import pytest
import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.tables import failed_error_imports, failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.transport import RabbitMQTransport
from controlroom.transport._amqp_names import MAX_NESTING
from tests.nsb import failed_headers

pytestmark = pytest.mark.rabbitmq

BAD_NAME = b"X-Legacy-\xff\xfe-Name"


class RawLongString(bytes):
    """A header value sent as an AMQP long string (``S``) of these bytes, UTF-8 or not."""


class RawFieldValue(bytes):
    """A header value sent as these bytes: an AMQP field value, its type octet first."""


def nested(kind: bytes, depth: int) -> RawFieldValue:
    """A table (``F``) or an array (``A``) holding one of its own kind ``depth`` deep,
    encoded without recursion (pamqp's encoder recurses, as its decoder does)."""
    value = kind + struct.pack(">I", 0)
    for _ in range(depth - 1):
        inner = b"\x01x" + value if kind == b"F" else value  # a table's field has a name
        value = kind + struct.pack(">I", len(inner)) + inner
    return RawFieldValue(value)


@pytest.fixture
def raw_amqp_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let this test's publisher put raw bytes in header names and short strings, as a
    producer in another language can (pamqp only encodes text)."""
    table, short = pamqp.encode.METHODS["table"], pamqp.encode.METHODS["shortstr"]

    def raw_value(item: object) -> bytes:
        if isinstance(item, RawLongString):
            return b"S" + struct.pack(">I", len(item)) + item
        if isinstance(item, RawFieldValue):
            return bytes(item)
        return pamqp.encode.encode_table_value(item)

    def raw_table(value: dict) -> bytes:  # type: ignore[type-arg]
        raw = (RawLongString, RawFieldValue)
        if not any(isinstance(k, bytes) or isinstance(v, raw) for k, v in value.items()):
            return table(value)
        fields = b"".join(
            bytes([len(raw)]) + raw + raw_value(item)
            for key, item in value.items()
            for raw in [key if isinstance(key, bytes) else key.encode()]
        )
        return struct.pack(">I", len(fields)) + fields

    def raw_short(value: str | bytes) -> bytes:
        return bytes([len(value)]) + value if isinstance(value, bytes) else short(value)

    monkeypatch.setitem(pamqp.encode.METHODS, "table", raw_table)
    monkeypatch.setitem(pamqp.encode.METHODS, "shortstr", raw_short)


async def publish_raw(url: str, queue: str, headers: dict, body: bytes, message_id) -> None:  # type: ignore[no-untyped-def,type-arg]
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        await channel.queue_declare(queue, durable=True)
        properties = aiormq.spec.Basic.Properties(
            headers=headers, message_id=message_id, delivery_mode=2
        )
        await channel.basic_publish(body, routing_key=queue, properties=properties)
    finally:
        await connection.close()


def count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()


Published = tuple[dict[Any, Any], bytes, str | bytes]
"""A message as ``publish_raw`` sends it: headers, body, AMQP message id."""


def ingest(
    settings: Settings, engine: sa.Engine, rabbitmq_url: str, messages: list[Published]
) -> tuple[list[Any], list[str]]:
    """Publish ``messages`` in order to ``settings.error_queue``, ingest until each is a
    failed message or a failed import; answers the failed imports' rows and the stored
    message ids."""

    async def scenario() -> None:
        for headers, body, message_id in messages:
            await publish_raw(rabbitmq_url, settings.error_queue, headers, body, message_id)
        async with RabbitMQTransport(rabbitmq_url) as transport:
            service = IngestionService(
                settings, engine, transport, FileSystemBodyStore(settings.body_dir)
            )
            task = asyncio.create_task(service.run())
            try:
                async with asyncio.timeout(30):
                    while count(engine, failed_messages) + count(
                        engine, failed_error_imports
                    ) < len(messages):
                        assert not task.done(), task.exception()
                        await asyncio.sleep(0.1)
            finally:
                await service.stop()

    asyncio.run(scenario())
    with engine.connect() as conn:
        kept = list(conn.execute(sa.select(failed_error_imports)).all())
        stored = list(conn.execute(sa.select(failed_messages.c.message_id)).scalars().all())
    return kept, stored


def bad_then_good(bad_headers: dict[Any, Any]) -> list[Published]:
    """A message of ``bad_headers`` (body ``\x00raw``), then a good one (``behind-it``)."""
    return [(bad_headers, b"\x00raw", "id-1"), (failed_headers("behind-it"), b"{}", "id-2")]


def test_a_non_utf8_header_name_becomes_a_failed_import_and_the_queue_moves_on(
    settings: Settings, engine: sa.Engine, rabbitmq_url: str, raw_amqp_encoding: None
) -> None:
    settings = settings.model_copy(
        update={"broker_url": rabbitmq_url, "error_queue": f"error-{uuid.uuid4().hex[:8]}"}
    )
    bad_headers = {**failed_headers("bad-name"), BAD_NAME: "value"}
    imported, stored = ingest(
        settings,
        engine,
        rabbitmq_url,
        [
            (bad_headers, b"\x00raw", "id-1"),
            ({"a": "b"}, b"\x01raw", b"\xff\xfe-id"),
            (failed_headers("behind-it"), b"{}", "id-3"),
        ],
    )
    assert len(imported) == 2 and stored == ["behind-it"]
    with engine.connect() as conn:
        kept = conn.execute(
            sa.select(failed_error_imports).order_by(failed_error_imports.c.body)
        ).all()
    headers = json.loads(kept[0].headers_json)
    assert kept[0].body == b"\x00raw"  # whole, raw
    assert "X-Legacy-\udcff\udcfe-Name" in headers  # the bytes, escaped
    assert kept[0].reason == "header name 'X-Legacy-\\xff\\xfe-Name' is not UTF-8"
    assert json.loads(kept[1].headers_json)["NServiceBus.MessageId"] == "\udcff\udcfe-id"


def test_a_header_name_over_128_bytes_is_refused_before_sending(rabbitmq_url: str) -> None:
    async def publish() -> None:
        async with RabbitMQTransport(rabbitmq_url) as transport:
            await transport.publish(f"q-{uuid.uuid4().hex[:8]}", {"N" * 129: "v"}, b"x")

    with pytest.raises(ValueError, match="129 bytes"):
        asyncio.run(publish())


def test_a_message_id_over_255_bytes_is_refused_before_sending(rabbitmq_url: str) -> None:
    # The message-id property is an AMQP short string: pamqp raised TypeError, which the
    # retry processor counted as a failed send five times before giving up.
    async def publish() -> None:
        async with RabbitMQTransport(rabbitmq_url) as transport:
            await transport.publish(
                f"q-{uuid.uuid4().hex[:8]}", {"NServiceBus.MessageId": "m" * 256}, b"x"
            )

    with pytest.raises(ValueError, match="255 bytes"):
        asyncio.run(publish())


def test_a_content_type_over_255_bytes_travels_in_the_headers_only(rabbitmq_url: str) -> None:
    # A failed message's NServiceBus.ContentType header may be longer than the AMQP
    # content-type property holds; its retry is still sent, the header whole.
    content_type = "application/json; profile=" + "p" * 300
    queue = f"q-{uuid.uuid4().hex[:8]}"

    async def scenario() -> dict[str, str | None]:
        async with RabbitMQTransport(rabbitmq_url) as transport:
            await transport.publish(
                queue,
                {"NServiceBus.MessageId": "m-1", "NServiceBus.ContentType": content_type},
                b"{}",
                content_type=content_type,
            )
            stream = transport.consume(queue, 1)
            delivery = await anext(stream)
            await delivery.ack()
            await stream.aclose()
            await transport.purge(queue)
            return delivery.headers

    headers = asyncio.run(asyncio.wait_for(scenario(), 30))

    assert headers["NServiceBus.ContentType"] == content_type


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NServiceBus.FailedQ", b"\xff\xff"),
        ("NServiceBus.ExceptionInfo.Message", b"bad \xff"),
        ("NServiceBus.MessageId", b"\xc3\x28"),
    ],
)
def test_a_non_utf8_header_value_becomes_a_failed_import_and_the_queue_moves_on(
    settings: Settings,
    engine: sa.Engine,
    rabbitmq_url: str,
    raw_amqp_encoding: None,
    name: str,
    value: bytes,
) -> None:
    settings = settings.model_copy(
        update={"broker_url": rabbitmq_url, "error_queue": f"error-{uuid.uuid4().hex[:8]}"}
    )

    bad_headers = {**failed_headers("bad-value"), name: RawLongString(value)}
    kept, stored = ingest(settings, engine, rabbitmq_url, bad_then_good(bad_headers))
    assert stored == ["behind-it"]
    assert len(kept) == 1 and kept[0].body == b"\x00raw"  # whole, raw
    assert kept[0].reason == f"the value of header {name!r} is not UTF-8"
    escaped = value.decode("utf-8", "surrogateescape")
    assert json.loads(kept[0].headers_json)[name] == escaped  # the bytes, kept


@pytest.mark.parametrize(("kind", "what"), [(b"F", "tables"), (b"A", "arrays")])
@pytest.mark.parametrize("depth", [40, 2000])
def test_a_header_nested_too_deep_becomes_a_failed_import_and_the_queue_moves_on(
    settings: Settings,
    engine: sa.Engine,
    rabbitmq_url: str,
    raw_amqp_encoding: None,
    kind: bytes,
    what: str,
    depth: int,
) -> None:
    """Breaker pass (sixth): a header table nested 400 deep (2.5 KB) made pamqp's decoder
    raise RecursionError in every delivery of its frame; the connection dropped and came
    back every 5 s, the message was redelivered for ever and every message behind it
    waited. Decoding stops at ``MAX_NESTING`` levels; the rest is kept as its bytes."""
    settings = settings.model_copy(
        update={"broker_url": rabbitmq_url, "error_queue": f"error-{uuid.uuid4().hex[:8]}"}
    )

    deep = {**failed_headers("deep"), "Deep": nested(kind, depth)}
    kept, stored = ingest(settings, engine, rabbitmq_url, bad_then_good(deep))
    assert stored == ["behind-it"]
    assert len(kept) == 1 and kept[0].body == b"\x00raw"  # whole, raw
    assert kept[0].reason == (
        "the queue could not read the message whole: header 'Deep' holds "
        f"{what} nested more than {MAX_NESTING} deep (the deeper levels kept as their AMQP bytes)"
    )
    headers = json.loads(kept[0].headers_json)
    assert headers["NServiceBus.MessageId"] == "deep"
    # The levels past the bound, as their bytes: what the producer sent, none of it lost.
    innermost = json.loads(headers["Deep"])  # a nested header's text is its JSON
    for _ in range(MAX_NESTING - 1):
        [innermost] = innermost.values() if kind == b"F" else innermost
    assert innermost.encode("utf-8", "surrogateescape") == nested(kind, depth - MAX_NESTING + 1)[1:]


@pytest.mark.parametrize(
    ("value", "what"), [({"queue": "Sales"}, "a table"), (["Sales", "Billing"], "an array")]
)
@pytest.mark.parametrize("name", ["NServiceBus.FailedQ", "NServiceBus.MessageId"])
def test_a_structured_identity_header_becomes_a_failed_import_and_the_queue_moves_on(
    settings: Settings,
    engine: sa.Engine,
    rabbitmq_url: str,
    name: str,
    value: object,
    what: str,
) -> None:
    """Breaker, session 32: an AMQP table as ``NServiceBus.FailedQ`` was stored as a failed
    message whose queue was the table's JSON, where a retry would send it. The headers
    that name the failed queue and the message are text in the wire contract
    (docs/decisions.md "A table or an array where the wire contract reads text")."""
    settings = settings.model_copy(
        update={"broker_url": rabbitmq_url, "error_queue": f"error-{uuid.uuid4().hex[:8]}"}
    )

    bad_headers = {**failed_headers("structured"), name: value}
    kept, stored = ingest(settings, engine, rabbitmq_url, bad_then_good(bad_headers))
    assert stored == ["behind-it"]
    assert len(kept) == 1 and kept[0].body == b"\x00raw"  # whole, raw
    assert kept[0].reason == f"header {name!r} holds {what}, where the wire contract reads text"
    assert json.loads(json.loads(kept[0].headers_json)[name]) == value  # kept, as its JSON
