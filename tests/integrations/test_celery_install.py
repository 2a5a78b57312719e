"""``install(app)`` without a worker: the brokers it accepts (docs/decisions.md "The
Celery integration needs RabbitMQ") and the time of sending it stamps on the task
messages a process publishes, read back into a failure's ``NServiceBus.TimeSent``
(README "Python task queues"). Celery's in-memory transport carries the messages: it is
a broker of Celery's own, in one process, not a stand-in for one."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery

from controlroom.errors.ingest import headers as h
from controlroom.errors.retries import wire as retry_wire
from controlroom.integrations import envelope
from controlroom.integrations.celery import HOOK_ATTRIBUTE, install


@pytest.mark.parametrize(
    "broker",
    [
        "redis://127.0.0.1:6379/0",
        "rediss://:secret@cache.internal:6380/1",
        "sqs://",
        "filesystem://",
    ],
)
def test_install_refuses_a_broker_that_is_not_rabbitmq(broker: str) -> None:
    app = Celery("shop", broker=broker)

    with pytest.raises(ValueError, match="RabbitMQ") as refused:
        install(app)

    scheme = broker.split(":", 1)[0]
    assert f"{scheme}://" in str(refused.value)  # names the broker
    assert "secret" not in str(refused.value)  # without its password
    assert getattr(app, HOOK_ATTRIBUTE, None) is None  # nothing installed


@pytest.mark.parametrize(
    "broker",
    [
        "amqp://guest:guest@127.0.0.1:5672//",
        "pyamqp://guest@rabbitmq//",
        "amqps://guest@rabbitmq:5671//",
        None,  # Celery's default: amqp://guest@localhost//
        "memory://",  # an app's own tests: nothing to confirm, nothing to lose
    ],
)
def test_install_accepts_rabbitmq_and_the_in_memory_test_broker(broker: str | None) -> None:
    app = Celery("shop", broker=broker)
    install(app)
    assert getattr(app, HOOK_ATTRIBUTE, None) is not None
    assert app.conf.task_acks_late is True


def test_install_refuses_a_read_broker_that_is_not_rabbitmq() -> None:
    app = Celery("shop", broker="amqp://guest@rabbitmq//")
    app.conf.broker_read_url = "redis://cache.internal:6379/0"
    with pytest.raises(ValueError, match=r"redis://"):
        install(app)


def sent_and_received(headers: dict[str, Any] | None = None) -> Any:
    """A task sent by an installed app on the in-memory broker, as a worker receives it
    (a kombu message)."""
    app = Celery("shop", broker="memory://")
    install(app)
    queue = f"tasks-{uuid.uuid4().hex[:8]}"
    with app.connection_for_write() as connection:
        app.send_task("shop.charge", args=(1,), queue=queue, connection=connection, headers=headers)
        received = connection.SimpleQueue(queue, no_ack=True).get(timeout=10)
    return app, received


def failed_message(app: Celery, message: Any) -> dict[str, str | None]:
    hook = getattr(app, HOOK_ATTRIBUTE)
    failure = envelope.capture_failure(ValueError("card declined"))
    headers, _ = hook.failed_message(
        message, task_id=message.headers["id"], task_name="shop.charge", retries=0, failure=failure
    )
    return dict(headers)


def test_a_sent_task_carries_its_time_of_sending_into_its_failure() -> None:
    before = datetime.now(UTC)
    app, message = sent_and_received()
    after = datetime.now(UTC)

    stamp = message.headers[envelope.TIME_SENT]
    sent = datetime.fromisoformat(stamp)
    assert sent.utcoffset() == timedelta(0)  # UTC
    assert before <= sent <= after
    headers = failed_message(app, message)
    assert headers[h.TIME_SENT] == retry_wire.format_nsb_time(sent)


def test_a_task_sent_without_the_stamp_fails_without_a_time_of_sending() -> None:
    app, message = sent_and_received()
    del message.headers[envelope.TIME_SENT]  # a producer without install
    assert h.TIME_SENT not in failed_message(app, message)


def test_an_unreadable_stamp_is_left_out_and_a_producer_s_own_is_kept() -> None:
    app, message = sent_and_received(headers={envelope.TIME_SENT: "yesterday"})
    assert message.headers[envelope.TIME_SENT] == "yesterday"  # not replaced
    assert h.TIME_SENT not in failed_message(app, message)
