"""The marks a running ``serve`` leaves in its data directory (``runtime.serve_lock``).

Source: docs/design.md "Process shape": several ``serve`` processes may share one
database; they must then consume one broker, or one takes the retries the other's
endpoints wait for. Each ``serving`` block below stands for one ``serve`` process (flock
locks belong to an open file, so two blocks in one process behave as two processes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controlroom.exceptions import ConfigurationError
from controlroom.runtime.serve_lock import is_served, serving
from controlroom.transport import RabbitMQTransport
from controlroom.transport.embedded import EmbeddedQueue

STORE = "sqlite:///data/controlroom.db"
RABBITMQ = "RabbitMQTransport('amqp://guest:***@127.0.0.1:5672/')"
EMBEDDED = "EmbeddedQueue('data/queue.db')"


def test_a_serve_marks_its_data_directory_while_it_runs(tmp_path: Path) -> None:
    assert not is_served(tmp_path)
    with serving(tmp_path, store=STORE, broker=EMBEDDED):
        assert is_served(tmp_path)
    assert not is_served(tmp_path)


def test_serves_of_one_store_and_one_broker_run_side_by_side(tmp_path: Path) -> None:
    with (
        serving(tmp_path, store=STORE, broker=RABBITMQ),
        serving(tmp_path, store=STORE, broker=RABBITMQ),
    ):
        assert is_served(tmp_path)


def test_a_serve_of_the_same_store_with_another_broker_is_refused(tmp_path: Path) -> None:
    with serving(tmp_path, store=STORE, broker=EMBEDDED):
        with (
            pytest.raises(ConfigurationError) as refused,
            serving(tmp_path, store=STORE, broker=RABBITMQ),
        ):
            pytest.fail("the second serve ran")
        message = str(refused.value)
        assert EMBEDDED in message and RABBITMQ in message
        assert "CONTROLROOM_DATA_DIR" in message


def test_serves_of_other_stores_may_use_other_brokers(tmp_path: Path) -> None:
    with (
        serving(tmp_path, store=STORE, broker=EMBEDDED),
        serving(tmp_path, store="postgresql+psycopg://postgres@db/other", broker=RABBITMQ),
    ):
        assert is_served(tmp_path)


def test_once_every_serve_has_stopped_another_broker_may_take_the_store(tmp_path: Path) -> None:
    with serving(tmp_path, store=STORE, broker=EMBEDDED):
        pass
    with (
        serving(tmp_path, store=STORE, broker=RABBITMQ),
        pytest.raises(ConfigurationError),
        serving(tmp_path, store=STORE, broker=EMBEDDED),
    ):
        pass


@pytest.mark.parametrize(
    "spelling",
    [
        "amqp://guest:guest@127.0.0.1/fresh",
        "amqp://other:secret@127.0.0.1:5672/fresh?heartbeat=30",
        "AMQP://guest@127.0.0.1:5672/fresh",
    ],
)
def test_one_broker_spelt_otherwise_is_the_same_broker(tmp_path: Path, spelling: str) -> None:
    """Fresh-user pass: the same broker and vhost spelt with the default port, another
    user or a query parameter was refused as another broker. Names that need resolving
    (``localhost`` and ``127.0.0.1``) still count as two."""
    first = RabbitMQTransport("amqp://guest:guest@127.0.0.1:5672/fresh")
    with serving(tmp_path, store=STORE, broker=first.destination):
        with serving(tmp_path, store=STORE, broker=RabbitMQTransport(spelling).destination):
            assert is_served(tmp_path)
        other_vhost = RabbitMQTransport("amqp://guest:guest@127.0.0.1:5672/other")
        with (
            pytest.raises(ConfigurationError),
            serving(tmp_path, store=STORE, broker=other_vhost.destination),
        ):
            pytest.fail("a serve on another vhost ran")


def test_the_destination_names_no_credentials() -> None:
    transport = RabbitMQTransport("amqps://guest:S3CRET@Broker.Example/%2F")
    assert transport.destination == "RabbitMQ amqps://broker.example:5671/%2F"


def test_an_ipv6_brokers_destination_writes_its_host_in_brackets() -> None:
    """Breaker pass (fifth): ``amqp://::1:5672/...`` in a refusal was no URL."""
    assert RabbitMQTransport("amqp://g:g@[::1]/v").destination == "RabbitMQ amqp://[::1]:5672/v"


def test_one_queue_file_spelt_otherwise_is_the_same_destination(tmp_path: Path) -> None:
    """Breaker pass (fifth): ``import-failed`` refused the running serve's own embedded
    queue given as ``dir/../dir`` or through a symbolic link: "another" queue."""
    (tmp_path / "data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data")
    spellings = [
        tmp_path / "data" / "queue.db",
        tmp_path / "data" / ".." / "data" / "queue.db",
        tmp_path / "link" / "queue.db",
    ]
    assert len({EmbeddedQueue(path).destination for path in spellings}) == 1
