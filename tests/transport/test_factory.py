"""``create_transport`` follows ``CONTROLROOM_BROKER_URL``."""

from __future__ import annotations

from pathlib import Path

from controlroom.config import Settings
from controlroom.transport import EmbeddedQueue, RabbitMQTransport, Transport, create_transport


def test_no_broker_url_means_the_embedded_queue_in_the_data_dir(tmp_path: Path) -> None:
    transport = create_transport(Settings(data_dir=tmp_path))
    assert isinstance(transport, EmbeddedQueue)
    assert isinstance(transport, Transport)
    assert repr(transport) == repr(EmbeddedQueue(tmp_path / "queue.db"))
    assert not (tmp_path / "queue.db").exists()  # nothing opened before start()


def test_a_broker_url_means_rabbitmq(tmp_path: Path) -> None:
    url = "amqp://guest:s3cret@127.0.0.1:5672/"
    transport = create_transport(Settings(data_dir=tmp_path, broker_url=url))
    assert isinstance(transport, RabbitMQTransport)
    assert isinstance(transport, Transport)
    assert "s3cret" not in repr(transport)
