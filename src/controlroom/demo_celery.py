"""``controlroom demo celery``: a small shop's Celery app whose tasks fail in a few
realistic ways, run by a real worker, with ``controlroom.integrations.celery`` installed.

Needs RabbitMQ (the broker Controlroom ingests from). It sends a handful of tasks to the
``demo.shop`` queue and runs a worker (``-P solo``) until stopped, so failures arrive in
Controlroom grouped by cause, and the ones an operator retries run again on this worker:

- ``shop.import_order``: a bug (``KeyError`` on a missing field) that fails again on
  retry: the same failed message, another attempt;
- ``shop.charge_card``: a payment gateway that is down at first (``ConnectionError``
  after Celery's own two retries), up by the time an operator retries: Resolved;
- ``shop.ship``: a timeout talking to the carrier (``TimeoutError``, chained to the
  ``OSError`` under it), which succeeds on retry;
- ``shop.invoice``: a pickled task (binary body) failing with ``ZeroDivisionError`` on a
  zero quantity; retried byte for byte, it fails again. Left out when the demo runs as
  root without ``C_FORCE_ROOT``: Celery refuses to run a worker that accepts pickle as
  root (unpickling what anyone may publish runs their code), and the demo does not
  override that for the user.
"""

from __future__ import annotations

import os
import time
from typing import Any

QUEUE = "demo.shop"
_started = time.monotonic()
RECOVERY_SECONDS = 20.0
"""After this long the demo's "outages" (gateway, carrier) are over: retries succeed."""


def accepts_pickle() -> bool:
    """Whether the demo's worker may accept pickle: Celery refuses it to root unless
    ``C_FORCE_ROOT`` is set."""
    return os.geteuid() != 0 or bool(os.environ.get("C_FORCE_ROOT"))


def make_app(broker_url: str, error_queue: str) -> Any:
    """The demo shop's Celery app on ``broker_url``, failures to ``error_queue``."""
    from celery import Celery

    from controlroom.integrations.celery import install

    app = Celery("demo-shop", broker=broker_url)
    app.conf.update(
        task_default_queue=QUEUE,
        accept_content=["json", "pickle"] if accepts_pickle() else ["json"],
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    install(app, error_queue=error_queue)

    @app.task(name="shop.import_order")
    def import_order(order: dict[str, Any]) -> str:
        return str(order["customer"]["email"])  # the bug: some orders have no customer

    @app.task(
        name="shop.charge_card",
        autoretry_for=(ConnectionError,),
        max_retries=2,
        default_retry_delay=1,
        retry_backoff=False,
    )
    def charge_card(order_id: int, amount_cents: int) -> str:
        if _outage():
            raise ConnectionError(f"payment gateway unreachable charging order {order_id}")
        return f"charged {amount_cents} for order {order_id}"

    @app.task(name="shop.ship")
    def ship(order_id: int, carrier: str) -> str:
        if _outage():
            try:
                raise OSError(110, "Connection timed out")
            except OSError as exc:
                raise TimeoutError(f"{carrier} did not answer for order {order_id}") from exc
        return f"order {order_id} shipped with {carrier}"

    @app.task(name="shop.invoice", serializer="pickle")
    def invoice(order_id: int, lines: list[tuple[str, int, int]]) -> float:
        return sum(price for _, price, _ in lines) / sum(quantity for *_, quantity in lines)

    return app


def _outage() -> bool:
    return time.monotonic() - _started < RECOVERY_SECONDS


def send_failing_tasks(app: Any) -> int:
    """Send the demo's tasks; returns how many will fail."""
    tasks: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("shop.import_order", ({"id": 1001, "lines": 2},), {}),
        ("shop.import_order", ({"id": 1002, "customer": {}},), {}),
        ("shop.charge_card", (1003, 4999), {}),
        ("shop.ship", (1004, "ParcelCo"), {}),
    ]
    if accepts_pickle():
        tasks.append(("shop.invoice", (1005, [("widget", 1200, 0)]), {"serializer": "pickle"}))
    else:
        print(
            "Running as root: the pickled task is left out (Celery refuses a worker that "
            "accepts pickle as root; set C_FORCE_ROOT=1 to include it anyway)."
        )
    for name, args, options in tasks:
        app.send_task(name, args=args, queue=QUEUE, **options)
    return len(tasks)


def run(broker_url: str, error_queue: str) -> None:
    """Send the tasks, then run a worker until it is stopped (Ctrl+C, SIGTERM)."""
    app = make_app(broker_url, error_queue)
    send_failing_tasks(app)
    app.worker_main(
        [
            "worker",
            *("-P", "solo", "-Q", QUEUE, "-l", "INFO", "-n", "demo-shop@%h"),
            *("--without-heartbeat", "--without-mingle", "--without-gossip"),
        ]
    )
