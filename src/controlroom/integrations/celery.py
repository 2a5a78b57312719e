"""Celery tasks that fail for good become failed messages in Controlroom.

Source: docs/design.md "Python task queues"; docs/decisions.md "Celery failures are
captured by the worker's request, before the acknowledgement". One line in the app::

    from controlroom.integrations.celery import install
    install(app)                       # error_queue="error", endpoint=app.main

``install`` refuses an app whose broker is not RabbitMQ (docs/decisions.md "The Celery
integration needs RabbitMQ"), hooks the app's workers, and stamps the task messages the
process publishes with the time they were sent (``envelope.TIME_SENT``):

- **Where**: the worker's ``Request`` of every task (a subclass of the task's own
  request class) and the worker's consumer. Both run in the worker's main process,
  which holds the task message, so every way a task ends for good is seen there: an
  exception with no retry left (``self.retry``/``autoretry_for`` exhausted, or none),
  a hard time limit, a pool process that died (``WorkerLostError``), ``Reject`` without
  requeue, and messages the consumer refuses (unknown task, undecodable or disallowed
  content, no task name). A Celery retry that will run again, ``Ignore``, a revoke and
  a requeue are not failures.
- **What**: exactly one failed message per failure (a hard time limit, which Celery
  reports twice, is one): ``envelope.failed_message_headers`` plus the task message's
  body bytes, exactly as consumed, and its broker properties
  (``Controlroom.TaskQueue.Properties``), so a retry from Controlroom sends the message
  its producer sent. The exception is read as text (``envelope.capture_failure``),
  never pickled or raised again. The time of sending (``NServiceBus.TimeSent``) is the
  task message's ``envelope.TIME_SENT``, stamped at publish (Celery's
  ``before_task_publish``) by a producer that installed the integration; a message from
  a producer without it has none, and neither has its failure.
- **When**: before the task message is acknowledged: ``install`` turns on
  ``acks_late`` for every task. The failed message is published on a connection of its
  own with publisher confirms, so once the worker acknowledges, the broker holds the
  failure on disk, whether or not Controlroom is running. A worker killed between the
  publish and the acknowledgement runs the task again on redelivery; the second
  failure folds into the same failed message (same task id).
- **When the publish fails** (broker unreachable, no confirm within
  ``confirm_timeout``): the whole failed message is logged at ERROR and the task
  message is requeued rather than acknowledged, so the failure is not lost; the task
  runs again when it is redelivered.
- **Retry and confirmation**: a task message Controlroom retried carries
  ``ServiceControl.Retry.UniqueMessageId``; a failure copies it (one row, another
  attempt), a success publishes the confirmation (``envelope.confirmation_headers``) to
  ``ServiceControl.Retry.AcknowledgementQueue`` before the acknowledgement, and the
  failed message becomes Resolved. A confirmation that cannot be sent is logged; the
  message then stays unconfirmed (RetryIssued) in Controlroom, never resolved.
- **Too large**: a body over ``max_body_bytes``, or one the broker refuses for its
  size, is not sent; the failure is, with an empty body and
  ``Controlroom.TaskQueue.BodyNotKept`` saying why.
- **A worker process that dies holding the message** (the solo or threads pool's
  process, prefork's main process: a segfault, an out-of-memory kill): RabbitMQ
  redelivers the message. The consumer does not run a redelivered message: it publishes
  it again to its queue (confirmed) with ``Controlroom.TaskQueue.Redeliveries`` one
  higher and acknowledges it; at ``max_worker_deaths`` it sends one failed message
  (``controlroom.integrations.WorkerDied``) and acknowledges it instead
  (docs/decisions.md "A task that kills its worker is counted in the message and
  reported at a limit"). An ETA task whose time has not come waited, never ran: it is
  not counted; nor is a message this process requeued itself.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.identity import deterministic_id
from controlroom.errors.retries import wire as retry_wire
from controlroom.integrations import WorkerDied, envelope

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 15 * 1024 * 1024
"""The largest task body sent with its failure: RabbitMQ 4 refuses messages over 16 MiB
by default (``max_message_size``), and the failure's headers need room too."""

DEFAULT_CONFIRM_TIMEOUT_SECONDS = 30.0
"""How long a publish waits for the broker's confirm before it counts as failed."""

AMQP_TRANSPORTS = frozenset({"amqp", "amqps", "pyamqp", "librabbitmq"})
"""kombu's names of the RabbitMQ transports: publisher confirms and the ``redelivered``
flag, which the integration relies on (docs/decisions.md "The Celery integration needs
RabbitMQ")."""

TEST_TRANSPORTS = frozenset({"memory"})
"""Also accepted: kombu's in-process broker, which an app's own tests use; nothing leaves
the process, so there is nothing to confirm or lose."""

HOOK_ATTRIBUTE = "_controlroom_hook"
_REQUEUED_REMEMBERED = 10_000  # task ids a process remembers having requeued
_ON_SUCCESS = "on_success"


def install(
    app: Any,
    *,
    error_queue: str = "error",
    endpoint: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    confirm_timeout: float = DEFAULT_CONFIRM_TIMEOUT_SECONDS,
    max_worker_deaths: int = envelope.DEFAULT_MAX_WORKER_DEATHS,
) -> None:
    """Send the failures of ``app``'s tasks to Controlroom's ``error_queue`` on ``app``'s
    broker (RabbitMQ: confirmed publishes) and confirm Controlroom's retries that
    succeed. ``endpoint`` names the app in Controlroom (default ``app.main``, else
    ``celery``). Call it where the app is configured, before a worker starts; calling it
    again replaces the settings. ``max_worker_deaths``: a task message RabbitMQ
    redelivers after the worker process holding it died this many times is reported
    (``controlroom.integrations.WorkerDied``) instead of run again
    (``envelope.DEFAULT_MAX_WORKER_DEATHS``; 0: never, it is redelivered for ever).

    Turns on ``task_acks_late`` (and ``acks_late`` on every task when the worker starts):
    the failure must be published before the task message is acknowledged. Stamps every
    task message this process publishes, whichever app sends it (Celery's
    ``before_task_publish`` does not say), with ``envelope.TIME_SENT`` (UTC) unless it
    has one. Raises ``ValueError`` for an empty queue name, a non-positive limit, or a
    broker (``broker_url``, ``broker_read_url``, ``broker_write_url``) that is not
    RabbitMQ (``AMQP_TRANSPORTS``; ``memory://`` is accepted for an app's tests). A
    broker configured only after ``install`` is checked when the worker starts, and
    logged at ERROR there when it is not RabbitMQ.
    """
    if not error_queue:
        raise ValueError("error_queue must be a queue name")
    if max_body_bytes < 0 or confirm_timeout <= 0 or max_worker_deaths < 0:
        raise ValueError(
            "max_body_bytes and max_worker_deaths must not be negative, confirm_timeout "
            "must be positive"
        )
    check_broker(app)
    hook = _Hook(
        app,
        error_queue=error_queue,
        endpoint=endpoint or app.main or "celery",
        max_body_bytes=max_body_bytes,
        confirm_timeout=confirm_timeout,
        max_worker_deaths=max_worker_deaths,
    )
    first = getattr(app, HOOK_ATTRIBUTE, None) is None
    setattr(app, HOOK_ATTRIBUTE, hook)
    _configure(app)
    _stamp_time_sent()
    if first:
        from celery import signals

        def configure_worker(sender: Any = None, instance: Any = None, **_: Any) -> None:
            if getattr(instance, "app", None) is app:
                _configure(app)  # again: a later config_from_object may have reset it
                try:
                    check_broker(app)
                except ValueError as exc:  # configured after install: said once, at start
                    log.error("Controlroom: %s", exc)

        signals.celeryd_init.connect(configure_worker, weak=False)


def check_broker(app: Any) -> None:
    """Raise ``ValueError``, naming the broker (without its password), when ``app``'s
    broker for reading or writing is not RabbitMQ (``AMQP_TRANSPORTS``) or kombu's
    in-memory test broker. Reads the settings only: nothing is connected, and no
    transport is imported (kombu's Redis transport needs the ``redis`` package)."""
    from kombu.utils.url import maybe_sanitize_url

    conf = app.conf
    for url in (
        conf.broker_write_url or conf.broker_url,
        conf.broker_read_url or conf.broker_url,
    ):
        name = _transport_name(url, conf.broker_transport)
        if name in AMQP_TRANSPORTS | TEST_TRANSPORTS:
            continue
        shown = maybe_sanitize_url(url) if isinstance(url, str) else f"{name}://"
        raise ValueError(
            f"the Celery integration needs RabbitMQ (an AMQP broker), not {shown} "
            f"(kombu's {name} transport): it relies on publisher confirms before the task "
            "message is acknowledged and on the broker's redelivered flag, which only AMQP "
            'gives (docs/decisions.md "The Celery integration needs RabbitMQ")'
        )


def _transport_name(url: Any, transport: Any) -> str:
    """The kombu transport a broker setting names, lower case, as kombu's ``Connection``
    picks it: the ``broker_transport`` setting (a name, or a class: its ``driver_type``),
    else the scheme of the URL (the first of a failover list; ``x+y://`` is ``x``), else
    ``amqp``, Celery's default."""
    if transport:
        name = transport if isinstance(transport, str) else getattr(transport, "driver_type", "")
        return str(name or transport).lower()
    if isinstance(url, list | tuple):
        url = url[0] if url else None
    if not isinstance(url, str) or "://" not in url:
        return "amqp"
    scheme = url.split(";", 1)[0].split("://", 1)[0]
    return scheme.split("+", 1)[0].lower() or "amqp"


_stamping = False
_stamping_lock = threading.Lock()


def _stamp_time_sent() -> None:
    """Connect, once per process, the stamp of ``envelope.TIME_SENT`` on every task
    message published (Celery's ``before_task_publish`` may change the headers)."""
    global _stamping
    with _stamping_lock:
        if _stamping:
            return
        from celery import signals

        signals.before_task_publish.connect(_stamp, weak=False)
        _stamping = True


def _stamp(headers: Any = None, **_: Any) -> None:
    """Stamp the time of sending on a task message's headers unless it has one (a
    producer's own, or one a copy carries: the first publish is the time it was sent)."""
    if isinstance(headers, dict):
        headers.setdefault(envelope.TIME_SENT, datetime.now(UTC).isoformat())


def _configure(app: Any) -> None:
    """Late acknowledgement for every task, and the worker's consumer hooked."""
    from celery.utils.imports import symbol_by_name

    app.conf.task_acks_late = True
    consumer = symbol_by_name(app.conf.worker_consumer or "celery.worker.consumer:Consumer")
    if not issubclass(consumer, _ConsumerHook):
        app.conf.worker_consumer = type(
            f"Controlroom{consumer.__name__}", (_ConsumerHook, consumer), {}
        )


# --- the hooks ------------------------------------------------------------------------------
class _ConsumerHook:
    """Mixed into the worker's consumer class: hooks every task before its strategy is
    built, and sends the messages the consumer refuses to the error queue before it
    drops them."""

    app: Any
    connection_errors: Any
    strategies: Any

    def update_strategies(self) -> None:
        hook: _Hook = getattr(self.app, HOOK_ATTRIBUTE)
        hook.consumer = self
        for task in self.app.tasks.values():
            hook_task(task)
        super().update_strategies()  # type: ignore[misc]
        strategies: dict[str, Any] = self.strategies
        for name, strategy in strategies.items():
            strategies[name] = _counting_deaths(strategy, hook, self)

    def on_unknown_message(self, body: Any, message: Any) -> None:
        if self._refused(message, "UnknownMessage", "a message with no task name", None):
            super().on_unknown_message(body, message)  # type: ignore[misc]

    def on_unknown_task(self, body: Any, message: Any, exc: BaseException) -> None:
        name = (message.headers or {}).get("task")
        text = f"task {name!r} is not registered in this worker"
        if self._refused(message, "celery.exceptions.NotRegistered", text, exc):
            super().on_unknown_task(body, message, exc)  # type: ignore[misc]

    def on_invalid_task(self, body: Any, message: Any, exc: BaseException) -> None:
        if self._refused(message, None, None, exc):
            super().on_invalid_task(body, message, exc)  # type: ignore[misc]

    def on_decode_error(self, message: Any, exc: BaseException) -> None:
        if self._refused(message, None, None, exc):
            super().on_decode_error(message, exc)  # type: ignore[misc]

    def _refused(
        self, message: Any, kind: str | None, text: str | None, exc: BaseException | None
    ) -> bool:
        """Send the failure of a message the consumer refuses; ``True`` when sent, else
        the message is requeued (the consumer must not drop it then)."""
        hook: _Hook = getattr(self.app, HOOK_ATTRIBUTE)
        failure = envelope.capture_failure(exc if exc is not None else RuntimeError(text))
        if kind is not None:
            failure = envelope.CapturedFailure(
                exception_type=kind,
                message=text or failure.message,
                source=kind.rpartition(".")[0] or "celery",
                traceback=f"{kind}: {text}\n",
            )
        headers = message.headers or {}
        task_id = _task_id(message)
        sent = hook.send_failure(
            message,
            task_id=task_id,
            task_name=str(headers.get("task") or "(no task name)"),
            retries=_retries(headers),
            failure=failure,
        )
        if not sent:  # requeue instead of the drop that follows; the failure is not lost
            hook.requeued_here(task_id)
            message.reject_log_error(log, self.connection_errors, requeue=True)
        return sent


def _counting_deaths(strategy: Any, hook: _Hook, consumer: Any) -> Any:
    """``strategy`` (a task's message handler), first giving a redelivered message to
    ``hook.redelivered``, which may settle it unrun."""

    def handle(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kw: Any) -> Any:
        if (message.delivery_info or {}).get("redelivered") and hook.redelivered(
            message, ack, reject, consumer.connection_errors
        ):
            return None
        return strategy(message, body, ack, reject, callbacks, **kw)

    handle.__wrapped__ = strategy  # type: ignore[attr-defined]
    return handle


def hook_task(task: Any) -> None:
    """Make ``task`` acknowledge late and run its messages through a Controlroom request
    (a subclass of its own request class). Idempotent."""
    from celery.utils.imports import symbol_by_name

    task.acks_late = True
    base = symbol_by_name(task.Request)
    if not issubclass(base, _RequestHook):
        task.Request = _request_class(base)


_request_classes: dict[type, type] = {}
_classes_lock = threading.Lock()


def _request_class(base: type) -> type:
    with _classes_lock:
        made = _request_classes.get(base)
        if made is None:
            made = _request_classes[base] = type(
                f"Controlroom{base.__name__}", (_RequestHook, base), {}
            )
        return made


class _RequestHook:
    """Mixed into a task's request class (worker main process): the failure is published
    before Celery settles the message; a retried task's success is confirmed."""

    _message: Any
    _task: Any
    _app: Any
    _request_dict: dict[str, Any]
    id: str
    acknowledged: bool

    def __init__(self, message: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(message, *args, **kwargs)  # type: ignore[call-arg]
        self._controlroom_done = False
        self._controlroom_requeue = False
        # Only a retried message pays for this: Celery's per-task request class
        # overrides on_success, so the confirmation wraps it on the instance.
        if retry_wire.RETRY_UNIQUE_MESSAGE_ID in (message.headers or {}):
            self.on_success = self._controlroom_on_success

    # -- failure ---------------------------------------------------------------------------
    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = _unwrap(exc_info.exception)
        if self._ends_for_good(exc):
            self._controlroom_send(exc, exc_info)
        return super().on_failure(exc_info, send_failed_event, return_ok)  # type: ignore[misc]

    def on_timeout(self, soft: bool, timeout: float) -> Any:
        if not soft and not self._controlroom_done:
            from billiard.einfo import ExceptionInfo
            from celery.exceptions import TimeLimitExceeded

            try:
                raise TimeLimitExceeded(timeout)
            except TimeLimitExceeded as exc:
                if self._ends_for_good(exc):
                    self._controlroom_send(exc, ExceptionInfo())
        return super().on_timeout(soft, timeout)  # type: ignore[misc]

    def _ends_for_good(self, exc: BaseException) -> bool:
        """Whether Celery settles the message for good after ``exc`` (no retry, no
        requeue): Celery's own rules in ``Request.on_failure``."""
        from celery.exceptions import (
            Ignore,
            Reject,
            Retry,
            Terminated,
            TimeLimitExceeded,
            WorkerLostError,
        )

        task = self._task
        if isinstance(exc, Terminated | Ignore | Retry):
            return False  # revoked by an operator, ignored, or retried by Celery
        if isinstance(exc, SystemExit | KeyboardInterrupt):
            return not (
                getattr(self, "_already_cancelled", False)
                or getattr(self, "_already_revoked", False)
            )
        if isinstance(exc, Reject):
            return not exc.requeue
        if isinstance(exc, WorkerLostError):
            max_retries = task.max_retries
            done = _retries(self._request_dict)
            exceeded = max_retries is not None and done >= max_retries
            if getattr(task, "retry_on_worker_lost", False) and not exceeded:
                return False
            if task.acks_late and task.reject_on_worker_lost and not exceeded:
                return False
            stored = getattr(self, "_success_was_stored", None)
            try:
                return not (stored and stored())
            except Exception:
                return True
        if isinstance(exc, TimeLimitExceeded):
            return not (task.acks_late and not task.acks_on_timeout)
        return True

    def _controlroom_send(self, exc: BaseException, exc_info: Any) -> None:
        if self._controlroom_done:
            return  # Celery reports a hard time limit twice: one failed message
        self._controlroom_done = True
        hook: _Hook = getattr(self._app, HOOK_ATTRIBUTE)
        failure = _captured(exc, getattr(exc_info, "traceback", None))
        sent = hook.send_failure(
            self._message,
            task_id=self.id,
            task_name=self._request_dict.get("task") or str(getattr(self, "name", "")),
            retries=_retries(self._request_dict),
            failure=failure,
        )
        self._controlroom_requeue = not sent

    def acknowledge(self) -> None:
        if self._controlroom_requeue:
            return self.reject(requeue=True)
        return super().acknowledge()  # type: ignore[misc,no-any-return]

    def reject(self, requeue: bool = False) -> None:
        requeue = requeue or self._controlroom_requeue
        if requeue:  # redelivered, but no worker died: not counted
            hook: _Hook = getattr(self._app, HOOK_ATTRIBUTE)
            hook.requeued_here(self.id)
        return super().reject(requeue=requeue)  # type: ignore[misc,no-any-return]

    # -- success of a retried task -----------------------------------------------------------
    def _controlroom_on_success(self, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        if not failed__retval__runtime[0]:
            hook: _Hook = getattr(self._app, HOOK_ATTRIBUTE)
            hook.confirm(self._message.headers or {})
        on_success: Any = getattr(type(self), _ON_SUCCESS)  # the class's (this is the instance's)
        return on_success(self, failed__retval__runtime, **kwargs)


# --- publishing ------------------------------------------------------------------------------
class _Hook:
    """One app's settings and its publishing connection (made on first use, in the
    process that uses it; one publish at a time)."""

    def __init__(
        self,
        app: Any,
        *,
        error_queue: str,
        endpoint: str,
        max_body_bytes: int,
        confirm_timeout: float,
        max_worker_deaths: int = envelope.DEFAULT_MAX_WORKER_DEATHS,
    ) -> None:
        self.app = app
        self.max_worker_deaths = max_worker_deaths
        self._requeued: dict[str, None] = {}
        self._requeued_lock = threading.Lock()
        self.error_queue = error_queue
        self.endpoint = endpoint
        self.max_body_bytes = max_body_bytes
        self.confirm_timeout = confirm_timeout
        self.host = socket.gethostname()
        self.consumer: Any = None
        self._lock = threading.Lock()
        self._connection: Any = None
        self._channel: Any = None
        self._pid = 0
        self._declared: set[str] = set()

    # -- a worker process that died holding the message ------------------------------------
    def redelivered(self, message: Any, ack: Any, reject: Any, connection_errors: Any) -> bool:
        """Settle ``message``, which RabbitMQ redelivered, unless it runs as usual (False:
        not counted, or it could not be published again, logged). Counted: published
        again to its queue with one more death in ``envelope.REDELIVERIES`` and
        acknowledged (``ack``: the consumer's promise); at ``max_worker_deaths`` its
        failure (``WorkerDied``) is sent and it is acknowledged, or, when the failure
        could not be sent, requeued (``reject``). Never raises."""
        try:
            task_id = _task_id(message)
            if not self.max_worker_deaths or self._was_requeued_here(task_id):
                return False
            headers = message.headers or {}
            if _waits(headers.get("eta")):
                return False  # an ETA task held for its time: it never ran
            deaths = envelope.redeliveries(headers) + 1
            if deaths >= self.max_worker_deaths:
                sent = self.send_failure(
                    message,
                    task_id=task_id,
                    task_name=str(headers.get("task") or "(no task name)"),
                    retries=_retries(headers),
                    failure=envelope.capture_failure(WorkerDied(deaths)),
                )
                if sent:
                    ack(log, connection_errors)
                else:
                    self.requeued_here(task_id)
                    reject(log, connection_errors, requeue=True)
                return True
            self.republish(message, deaths)
        except Exception:
            log.exception(
                "Controlroom: could not count the worker deaths of a redelivered task "
                "message; it runs again uncounted"
            )
            return False
        ack(log, connection_errors)
        return True

    def republish(self, message: Any, deaths: int) -> None:
        """Publish ``message`` again to the queue it came from, confirmed: its body bytes,
        broker properties and header table as consumed, ``envelope.REDELIVERIES`` set to
        ``deaths``. Raises what the broker or the connection raises."""
        properties = dict(message.properties)
        table = {**(properties.pop("application_headers", None) or {})}
        table[envelope.REDELIVERIES] = deaths
        priority = properties.pop("priority", None)
        content_type = properties.pop("content_type", None)
        content_encoding = properties.pop("content_encoding", None)

        def prepare(channel: Any) -> Any:
            return channel.prepare_message(
                message_body(message),
                priority,
                content_type,
                content_encoding,
                table,
                dict(properties),
            )

        self._send(self.consumed_queue(message), prepare)

    def requeued_here(self, task_id: str) -> None:
        """Remember that this process requeues the message of ``task_id`` (its
        redelivery counts no death)."""
        with self._requeued_lock:
            self._requeued[task_id] = None
            if len(self._requeued) > _REQUEUED_REMEMBERED:
                del self._requeued[next(iter(self._requeued))]

    def _was_requeued_here(self, task_id: str) -> bool:
        with self._requeued_lock:
            return self._requeued.pop(task_id, 0) is None

    # -- failures --------------------------------------------------------------------------
    def send_failure(
        self,
        message: Any,
        *,
        task_id: str,
        task_name: str,
        retries: int,
        failure: envelope.CapturedFailure,
    ) -> bool:
        """Publish the failure of ``message`` (a kombu message); ``False`` when it could
        not be published (logged whole, at ERROR). Never raises."""
        try:
            headers, body = self.failed_message(
                message, task_id=task_id, task_name=task_name, retries=retries, failure=failure
            )
        except Exception:
            log.exception("Controlroom: could not build the failed message of task %s", task_id)
            return False
        try:
            try:
                self.publish(self.error_queue, headers, body, task_id)
            except Exception as exc:
                if not body or not _refused_for_size(exc):
                    raise
                headers[envelope.BODY_NOT_KEPT] = f"the broker refused the body: {exc}"[:1000]
                body = b""
                self.publish(self.error_queue, headers, body, task_id)
        except Exception as exc:
            log.error(
                "Controlroom: the failure of task %s could not be sent to queue %r (%r); the "
                "task message is requeued. The failed message: %s",
                task_id,
                self.error_queue,
                exc,
                json.dumps(
                    {"headers": headers, "body_base64": base64.b64encode(body).decode("ascii")}
                ),
            )
            return False
        return True

    def failed_message(
        self,
        message: Any,
        *,
        task_id: str,
        task_name: str,
        retries: int,
        failure: envelope.CapturedFailure,
    ) -> tuple[dict[str, str | None], bytes]:
        """The failed message's headers and body for ``message`` (pure but for the time)."""
        body = message_body(message)
        table = envelope.without_redeliveries(message.headers or {})
        properties = {**message.properties, "headers": table}
        properties.pop("application_headers", None)
        try:
            properties_text: Mapping[str, Any] | None = properties
            envelope.properties_json(properties)
        except ValueError:  # a header value JSON cannot hold: kept as its text
            properties_text = {**properties, "headers": _texts(table)}
        not_kept = None
        if len(body) > self.max_body_bytes:
            not_kept = (
                f"the task message's body is {len(body)} bytes, over the "
                f"{self.max_body_bytes} bytes the Celery integration sends (max_body_bytes)"
            )
            body = b""
        retry_id = table.get(retry_wire.RETRY_UNIQUE_MESSAGE_ID)
        headers = envelope.failed_message_headers(
            kind=envelope.CELERY,
            task_id=task_id,
            task_name=task_name,
            queue=self.consumed_queue(message),
            endpoint=self.endpoint,
            host=self.host,
            failure=failure,
            time_of_failure=datetime.now(UTC),
            time_sent=envelope.time_sent(table),
            retries=retries,
            content_type=message.content_type,
            properties=properties_text,
            retry_unique_message_id=str(retry_id) if retry_id else None,
            body_not_kept=not_kept,
        )
        edit_of = table.get(retry_wire.EDIT_OF)
        if edit_of:
            headers[retry_wire.EDIT_OF] = str(edit_of)
        return headers, body

    def consumed_queue(self, message: Any) -> str:
        """The queue ``message`` was consumed from: the worker's queue of its consumer
        tag, else the routing key (the default exchange routes by queue name), else the
        app's default queue."""
        info = message.delivery_info or {}
        tag = info.get("consumer_tag")
        task_consumer = getattr(self.consumer, "task_consumer", None)
        for name, active in (getattr(task_consumer, "_active_tags", None) or {}).items():
            if active == tag:
                return str(name)
        exchange, key = info.get("exchange"), info.get("routing_key")
        if exchange:
            matches = [
                queue.name
                for queue in self.app.amqp.queues.values()
                if queue.exchange is not None
                and queue.exchange.name == exchange
                and queue.routing_key == key
            ]
            if len(matches) == 1:
                return str(matches[0])
        return str(key or self.app.conf.task_default_queue)

    def confirm(self, table: Mapping[str, Any]) -> None:
        """Confirm the successful retry ``table`` (the task message's headers) names;
        a failure to send is logged (the retry stays unconfirmed). Never raises."""
        unique_id = table.get(retry_wire.RETRY_UNIQUE_MESSAGE_ID)
        queue = table.get(retry_wire.RETRY_ACKNOWLEDGEMENT_QUEUE) or self.error_queue
        headers = envelope.confirmation_headers(str(unique_id))
        try:
            self.publish(str(queue), headers, b"", str(headers[h.MESSAGE_ID]))
        except Exception as exc:
            log.error(
                "Controlroom: the retry of failed message %s succeeded but its confirmation "
                "could not be sent to %r (%r); it stays unconfirmed in Controlroom",
                unique_id,
                queue,
                exc,
            )

    def publish(
        self, queue: str, headers: Mapping[str, str | None], body: bytes, message_id: str
    ) -> None:
        """Publish persistently to ``queue`` (declared durable when missing) through the
        default exchange and wait for the broker's confirm (RabbitMQ). Raises what the
        broker or the connection raises; the connection is made again next time."""

        def prepare(channel: Any) -> Any:
            return channel.prepare_message(
                body,
                None,
                headers.get(h.CONTENT_TYPE) or "application/octet-stream",
                None,
                dict(headers),
                {"delivery_mode": 2, "message_id": message_id},
            )

        self._send(queue, prepare)

    def _send(self, queue: str, prepare: Any) -> None:
        """Publish ``prepare(channel)`` as ``publish`` does."""
        with self._lock:
            try:
                channel = self._open_channel()
                self._declare(queue)
                channel = self._channel
                amqp_message = prepare(channel)
                confirmed = getattr(channel, "basic_publish_confirm", None)
                if confirmed is None:  # a broker without confirms (not RabbitMQ)
                    channel.basic_publish(amqp_message, exchange="", routing_key=queue)
                else:
                    confirmed(
                        amqp_message,
                        exchange="",
                        routing_key=queue,
                        mandatory=True,
                        confirm_timeout=self.confirm_timeout,
                    )
            except BaseException:
                self._close()
                raise

    def _open_channel(self) -> Any:
        if self._connection is None or self._pid != os.getpid():
            self._connection = None  # a forked copy is not ours to close
            connection = self.app.connection_for_write()
            connection.ensure_connection(max_retries=1)
            self._connection, self._pid, self._declared = connection, os.getpid(), set()
            self._channel = connection.channel()
        return self._channel

    def _declare(self, queue: str) -> None:
        """Declare ``queue`` durable when it does not exist (a passive declare first: an
        existing queue may have arguments of its own, which a declare must not
        contradict)."""
        if queue in self._declared:
            return
        try:
            self._channel.queue_declare(queue=queue, passive=True)
        except Exception as exc:
            if getattr(exc, "code", None) != 404:
                raise
            self._channel = self._connection.channel()  # a failed passive declare closes it
            self._channel.queue_declare(queue=queue, durable=True, auto_delete=False)
        self._declared.add(queue)

    def _close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and self._pid == os.getpid():
            try:
                connection.release()
            except Exception:
                log.debug("Controlroom: closing the publishing connection failed", exc_info=True)


# --- helpers ---------------------------------------------------------------------------------
def message_body(message: Any) -> bytes:
    """The body bytes of a kombu message as they came off the wire: py-amqp decodes a
    body with a ``content_encoding`` into ``str``, which encodes back to the same bytes
    (Celery's encodings: UTF-8 for JSON and YAML; ``binary`` bodies stay bytes)."""
    body = message.body
    if isinstance(body, str):
        return body.encode(message.content_encoding or "utf-8")
    return bytes(body)


def _task_id(message: Any) -> str:
    """The task id of a kombu message: its ``id`` header (Celery's protocol 2), else its
    correlation or message id, else an id derived from its headers and body."""
    headers = message.headers or {}
    return str(
        headers.get("id")
        or message.properties.get("correlation_id")
        or message.properties.get("message_id")
        or deterministic_id(repr(headers) + repr(message.body))
    )


def _waits(eta: Any) -> bool:
    """Whether a task message's ``eta`` header is a time still to come (a naive time is
    UTC, Celery's default)."""
    if not isinstance(eta, str | datetime) or not eta:
        return False
    try:
        when = eta if isinstance(eta, datetime) else datetime.fromisoformat(eta)
    except ValueError:
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when > datetime.now(UTC)


def _captured(exc: BaseException, traceback_text: str | None) -> envelope.CapturedFailure:
    """The failure as text; an exception Celery could not pickle across the pool keeps
    the type it wrapped."""
    failure = envelope.capture_failure(exc, traceback_text=traceback_text)
    module, name = getattr(exc, "exc_module", None), getattr(exc, "exc_cls_name", None)
    if isinstance(module, str) and isinstance(name, str):  # UnpickleableExceptionWrapper
        qualified = name if module == "builtins" else f"{module}.{name}"
        failure = envelope.CapturedFailure(
            exception_type=qualified,
            message=failure.message,
            source=module,
            traceback=failure.traceback,
        )
    return failure


def _unwrap(exc: Any) -> BaseException:
    """The exception inside billiard's ``ExceptionWithTraceback`` (only that: Celery's
    ``Retry`` has an ``exc`` of its own, the cause, which is not what ended the task)."""
    from billiard.einfo import ExceptionWithTraceback

    if isinstance(exc, ExceptionWithTraceback):
        inner: BaseException = exc.exc
        return inner
    return exc  # type: ignore[no-any-return]


def _retries(table: Mapping[str, Any]) -> int:
    try:
        return max(0, int(table.get("retries") or 0))
    except (TypeError, ValueError):
        return 0


def _texts(table: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in table.items():
        try:
            envelope.properties_json({"headers": {name: value}})
            out[name] = value
        except ValueError:
            out[name] = str(value)
    return out


def _refused_for_size(exc: BaseException) -> bool:
    return "size" in str(exc).lower() and getattr(exc, "code", None) in (406, None)
