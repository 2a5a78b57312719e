"""The Celery app the integration tests run in real worker processes (``celery -A
tests.integrations.celery_app worker``), configured from the environment the test sets:
the broker, Controlroom's error queue, a state directory where the tasks read what they
should do and the worker records the bytes of every task message it receives."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from celery import Celery, signals
from celery.exceptions import Reject

from controlroom.integrations import celery as integration

STATE = Path(os.environ.get("CELERY_TEST_STATE", "."))

app = Celery("shop", broker=os.environ.get("CELERY_TEST_BROKER", "memory://"))
app.conf.update(
    task_default_queue=os.environ.get("CELERY_TEST_QUEUE", "celery"),
    accept_content=["json", "pickle"],
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
integration.install(
    app,
    error_queue=os.environ.get("CELERY_TEST_ERROR_QUEUE", "error"),
    max_body_bytes=int(os.environ.get("CELERY_TEST_MAX_BODY_BYTES", "1048576")),
)


def check_card(order: int, amount: Any) -> None:
    if not (STATE / f"fixed-{order}").exists():
        raise ValueError(f"card declined for order {order}")


@app.task(name="shop.charge")
def charge(order: int, amount: Any) -> str:
    check_card(order, amount)
    return "charged"


@app.task(
    name="shop.retrying",
    autoretry_for=(ConnectionError,),
    max_retries=2,
    default_retry_delay=0,
    retry_backoff=False,
)
def retrying(order: int) -> None:
    raise ConnectionError(f"gateway down for order {order}")


@app.task(name="shop.rejecting")
def rejecting(order: int) -> None:
    raise Reject(f"order {order} is malformed", requeue=False)


@app.task(name="shop.slow", time_limit=1)
def slow() -> None:
    time.sleep(60)


@app.task(name="shop.crash")
def crash() -> None:
    os._exit(3)  # the pool process dies: WorkerLostError in the worker


@app.task(name="shop.kills_worker")
def kills_worker(order: int) -> str:
    """SIGKILLs the process it runs in (the worker's, with the solo pool) on every run
    until ``fixed-<order>`` exists, then on the first run only (``died-<order>`` says
    so); each run adds a line to ``runs-<order>``."""
    with (STATE / f"runs-{order}").open("a") as runs:
        runs.write("ran\n")
    fixed, died = STATE / f"fixed-{order}", STATE / f"died-{order}"
    if not fixed.exists() or not died.exists():
        if fixed.exists():
            died.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


@signals.task_received.connect
def record(request: Any = None, **_: Any) -> None:
    """The bytes and typed headers of every task message the worker receives."""
    body = integration.message_body(request._message)
    name = f"{request.id}-{time.time_ns()}"
    # The headers first and the body by rename: the tests count .bin files and may kill the
    # worker the moment one appears, so a counted receipt is always complete.
    (STATE / f"received-{name}.headers").write_text(repr(sorted(request._message.headers.items())))
    partial = STATE / f"received-{name}.partial"
    partial.write_bytes(body)
    partial.rename(STATE / f"received-{name}.bin")


@signals.task_success.connect
def succeeded(sender: Any = None, **_: Any) -> None:
    """Each success, a line in ``succeeded-<task id>``."""
    with (STATE / f"succeeded-{sender.request.id}").open("a") as runs:
        runs.write("succeeded\n")


if os.environ.get("CELERY_TEST_KILL_AFTER_PUBLISH") or os.environ.get(
    "CELERY_TEST_KILL_BEFORE_PUBLISH"
):
    # Fault injection: the worker is killed (SIGKILL) once (a marker file says so) around
    # the publish of a failure, before it acknowledges the task message: right after the
    # broker confirmed the failure (..._AFTER_PUBLISH), or once the failure is known but
    # before it is published (..._BEFORE_PUBLISH).
    _send = integration._Hook.send_failure
    _before = bool(os.environ.get("CELERY_TEST_KILL_BEFORE_PUBLISH"))

    def _die_once() -> None:
        marker = STATE / "killed"
        if not marker.exists():
            marker.write_text("once")
            os.kill(os.getpid(), signal.SIGKILL)

    def send_around_death(self: integration._Hook, *args: Any, **kwargs: Any) -> bool:
        if _before:
            _die_once()
        sent = _send(self, *args, **kwargs)
        if sent and not _before:
            _die_once()
        return sent

    integration._Hook.send_failure = send_around_death  # type: ignore[method-assign]
