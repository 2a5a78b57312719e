"""The Dramatiq app the integration tests run in real worker processes.

Configured by the environment the test gives its worker: ``DRAMATIQ_TEST_URL`` (the
broker, a vhost of the test's), ``DRAMATIQ_TEST_QUEUE`` (the actors' queue),
``DRAMATIQ_TEST_ERROR_QUEUE`` (Controlroom's error queue) and ``DRAMATIQ_TEST_ERROR_URL``
(its broker, when not Dramatiq's), ``DRAMATIQ_TEST_MAX_BODY_BYTES`` (the middleware's
``max_body_bytes``), ``DRAMATIQ_TEST_MARKER`` (a
file: ``flaky`` fails until it exists), ``DRAMATIQ_TEST_KILL`` (``before_publish`` or
``after_publish``: the worker SIGKILLs itself once, before or after the middleware
published a failure, leaving the message unacknowledged) and ``DRAMATIQ_TEST_ENCODER``
(``pickle``: Dramatiq's ``PickleEncoder`` instead of its JSON one). ``kills_its_worker`` SIGKILLs
its own worker process while it runs (as a segfault or an out-of-memory kill would).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.encoder import PickleEncoder
from dramatiq.middleware import (
    AgeLimit,
    Callbacks,
    Middleware,
    Pipelines,
    Retries,
    ShutdownNotifications,
    TimeLimit,
)

from controlroom.integrations.dramatiq import ControlroomMiddleware

QUEUE = os.environ.get("DRAMATIQ_TEST_QUEUE", "default")
MARKER = Path(os.environ.get("DRAMATIQ_TEST_MARKER", "/nonexistent/marker"))
KILL = os.environ.get("DRAMATIQ_TEST_KILL", "")
KILLED_ONCE = MARKER.with_suffix(".killed")


class KillOnce(Middleware):
    """SIGKILLs the worker process the first time a message is about to be rejected,
    at the place in the middleware order it was added (before or after Controlroom's)."""

    def before_nack(self, broker: dramatiq.Broker, message: Any) -> None:
        if not KILLED_ONCE.exists():
            KILLED_ONCE.touch()
            os.kill(os.getpid(), signal.SIGKILL)


broker = RabbitmqBroker(
    url=os.environ.get("DRAMATIQ_TEST_URL", "amqp://guest:guest@127.0.0.1:5672/"),
    middleware=[
        AgeLimit(),
        TimeLimit(interval=50),
        ShutdownNotifications(),
        Callbacks(),
        Pipelines(),
        Retries(min_backoff=10, max_backoff=20),
    ],
)
if KILL == "before_publish":
    broker.add_middleware(KillOnce())
broker.add_middleware(
    ControlroomMiddleware(
        error_queue=os.environ.get("DRAMATIQ_TEST_ERROR_QUEUE", "error"),
        url=os.environ.get("DRAMATIQ_TEST_ERROR_URL") or None,
        max_body_bytes=int(os.environ.get("DRAMATIQ_TEST_MAX_BODY_BYTES") or 64 * 1024 * 1024),
    )
)
if KILL == "after_publish":
    broker.add_middleware(KillOnce())
dramatiq.set_broker(broker)
if os.environ.get("DRAMATIQ_TEST_ENCODER") == "pickle":
    dramatiq.set_encoder(PickleEncoder())


class OrderRejected(Exception):
    pass


def check_order(order_id: int, note: str) -> None:
    raise OrderRejected(f"order {order_id} rejected: {note}")


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def place_order(order_id: int, note: str = "") -> None:
    check_order(order_id, note)


@dramatiq.actor(queue_name=QUEUE, max_retries=1)
def place_order_retried(order_id: int) -> None:
    check_order(order_id, "retried once by Dramatiq")


@dramatiq.actor(queue_name=QUEUE, max_retries=0, time_limit=200)
def slow_report() -> None:
    for _ in range(3000):  # short sleeps: the time limit's exception lands between them
        time.sleep(0.01)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def flaky(order_id: int) -> None:
    if not MARKER.exists():
        check_order(order_id, "the marker is missing")


@dramatiq.actor(queue_name=QUEUE, max_retries=1, throws=(OrderRejected,))
def rejected_then_flaky(order_id: int) -> None:
    """Fails for good (``throws``: no retry by Dramatiq) until the marker exists; then
    fails once more with an error Dramatiq retries, and succeeds on Dramatiq's retry."""
    if not MARKER.exists():
        check_order(order_id, "the marker is missing")
    once = MARKER.with_suffix(".once")
    if not once.exists():
        once.touch()
        raise RuntimeError("a transient error")


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def kills_its_worker(order_id: int) -> None:
    """SIGKILLs its worker process on every run while the marker is missing; once it
    exists, on the first run only (``.died`` says so), and succeeds after that. Each run
    adds a line to the marker's ``.runs``."""
    with MARKER.with_suffix(".runs").open("a") as runs:
        runs.write(f"{order_id}\n")
    died = MARKER.with_suffix(".died")
    if not MARKER.exists() or not died.exists():
        if MARKER.exists():
            died.touch()
        os.kill(os.getpid(), signal.SIGKILL)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def succeeds(order_id: int) -> None:
    pass
