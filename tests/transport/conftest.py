"""Fixtures for the transport tests: one factory per transport, unique queue names.

``transport_factory`` makes unstarted transports that share one backing store (the same
queue file, the same RabbitMQ vhost), so a second instance plays "another process".
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from controlroom.transport import EmbeddedQueue, RabbitMQTransport
from tests.transport.helpers import TransportFactory


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def queue_name() -> str:
    """A queue name no other test uses (RabbitMQ vhosts outlive single tests)."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def queue_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "queue.db"


@pytest.fixture(params=["embedded", "rabbitmq"])
def transport_factory(request: pytest.FixtureRequest, queue_path: Path) -> TransportFactory:
    """Makes transports of one kind over one shared store (the test runs once per kind)."""
    if request.param == "embedded":
        return lambda: EmbeddedQueue(queue_path)
    url = request.getfixturevalue("rabbitmq_url")
    return lambda: RabbitMQTransport(url)
