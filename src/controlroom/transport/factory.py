"""Pick the transport the settings ask for."""

from __future__ import annotations

from controlroom.config import Settings
from controlroom.transport.base import Transport
from controlroom.transport.embedded import EmbeddedQueue
from controlroom.transport.rabbitmq import RabbitMQTransport


def create_transport(settings: Settings, *, owner: str | None = None) -> Transport:
    """RabbitMQ when ``settings.broker_url`` is set, else the embedded queue file
    ``settings.embedded_queue_path`` (docs/design.md "Operational contract":
    ``CONTROLROOM_BROKER_URL`` empty means the embedded queue).

    The transport is not started: call ``await transport.start()``. ``owner`` names the
    embedded queue's claims (``EmbeddedQueue``); RabbitMQ gives a dead consumer's
    messages back by itself.
    """
    if settings.broker_url:
        return RabbitMQTransport(settings.broker_url)
    return EmbeddedQueue(settings.embedded_queue_path, owner=owner)
