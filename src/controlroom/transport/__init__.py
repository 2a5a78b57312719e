"""Intake and outbound transport: durable queues on RabbitMQ or the embedded SQLite file.

``create_transport(settings)`` picks one; both satisfy ``Transport``. See ``base`` for
the delivery contract (ack only after the commit, at-least-once redelivery).
"""

from controlroom.transport.base import (
    Delivery,
    DeliveryLostError,
    QueueDepth,
    Transport,
    TransportClosedError,
    TransportError,
)
from controlroom.transport.embedded import EmbeddedQueue
from controlroom.transport.factory import create_transport
from controlroom.transport.rabbitmq import RabbitMQTransport

__all__ = [
    "Delivery",
    "DeliveryLostError",
    "EmbeddedQueue",
    "QueueDepth",
    "RabbitMQTransport",
    "Transport",
    "TransportClosedError",
    "TransportError",
    "create_transport",
]
