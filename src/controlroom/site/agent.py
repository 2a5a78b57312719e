"""The store-and-forward engine of a site: cached calls, their retries, operator commands.

Source: docs/design.md "The site agent". A site's Python process makes a cached call with
``agent.cached_call(target, operation, payload, channel=...)``: the call runs at once; a
success is ``Delivered``; a permanent failure is ``Failed`` and raised
(``CachedCallFailed``); a transient failure is buffered and attempted again by
``attempt_due`` (the retry loop of ``controlroom.site.service``) with backoff until it is
``Delivered``, ``Failed`` or ``Parked``. Operations are registered by name, so a call
buffered before a restart is attempted again by the next process (``"http"``, an HTTP
request described by its payload, is built in).

Every transition is committed with its telemetry packet (``controlroom.site.store``);
``controlroom.site.outbox`` delivers the packets to central.

A site's notification (``agent.notify(target, subject, body, ...)``, or to explicit
addresses with ``recipients=``) is committed to the
store before the call returns and forwarded to central by the outbox, which delivers it
(docs/design.md "Notification outbox"): sites cannot reach the mail server or the web.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from json import dumps
from typing import Any

import httpx
from pydantic import ValidationError

from controlroom.exceptions import ControlroomError
from controlroom.site import lifecycle
from controlroom.site.config import SiteSettings
from controlroom.site.lifecycle import CallState, CommandOutcome, Status, Transition
from controlroom.site.store import DueCall, TrackingStore, state_from_row
from controlroom.site.telemetry import telemetry_packet
from controlroom.telemetry.contract import check_actor, describe_errors
from controlroom.telemetry.notification import SiteNotification, forwarded_item
from controlroom.telemetry.stamps import Stamp

Operation = Callable[[Any], object]
"""Makes one attempt of a call from its JSON payload; raises on failure
(``lifecycle.classify_failure`` says which failures are permanent). One that returns the
``httpx.Response`` that delivered the call reports its status code as the Delivered call's
``http_status``; any other return leaves it null."""

Clock = Callable[[], datetime]

HTTP_OPERATION = "http"


def utc_now() -> datetime:
    return datetime.now(UTC)


class CachedCallFailed(ControlroomError):
    """A cached call failed permanently (``Failed``); it is not attempted again."""

    def __init__(self, state: CallState) -> None:
        super().__init__(f"cached call {state.tracked_operation_id} failed: {state.last_error}")
        self.state = state


@dataclass(frozen=True, slots=True)
class CallResult:
    """Where a cached call stands after its first attempt: ``Delivered``, or buffered
    (``Attempted``, ``Parked`` with ``max_retries`` 1)."""

    tracked_operation_id: str
    status: Status


class SiteAgent:
    """The engine over one tracking store. Thread-safe: each method runs its own store
    transactions; SQLite serializes the writers."""

    def __init__(self, settings: SiteSettings, *, clock: Clock = utc_now) -> None:
        self.settings = settings
        self.store = TrackingStore.open(settings.store_path)
        self.instance = str(uuid.uuid4())
        self._clock = clock
        self._operations: dict[str, Operation] = {HTTP_OPERATION: self._http_attempt}
        self._actor = f"site:{settings.site_id}"
        # Calls the previous process had in hand when it stopped are due again.
        self.store.release_claims_of_others(self.instance)

    def close(self) -> None:
        self.store.close()

    def register(self, name: str, operation: Operation) -> None:
        """Make ``operation`` the one attempted for calls made under ``name``; register
        before buffered calls of ``name`` fall due (e.g. at import)."""
        self._operations[name] = operation

    # --- cached calls -------------------------------------------------------------------
    def cached_call(
        self,
        target: str,
        operation: str | Operation,
        payload: Any = None,
        *,
        channel: str = "ApiOutbound",
        tracked_operation_id: str | None = None,
    ) -> CallResult:
        """Record and attempt a cached call of ``operation`` with ``payload``
        (JSON-serializable) to ``target`` (as central's contract takes it:
        ``telemetry.contract.check_target``). ``operation`` is a registered name, or a
        function, registered here under its qualified name (register it at start-up too,
        so a restarted process can resume its buffered calls).

        Raises ``CachedCallFailed`` on a permanent failure, ``KeyError`` for an operation
        never registered, ``ValueError`` for a bad channel or target.
        """
        if callable(operation):
            name = f"{operation.__module__}.{operation.__qualname__}"
            self.register(name, operation)
            operation = name
        if operation not in self._operations:
            raise KeyError(f"no operation registered as {operation!r}")
        call_id = tracked_operation_id or str(uuid.uuid4())
        with self.store.transition(self._clock()) as (conn, stamp):
            transition = lifecycle.submitted(
                tracked_operation_id=call_id,
                channel=channel,
                target=target,
                source_site=self.settings.site_id,
                source_node=self.settings.node,
                stamp=stamp,
            )
            self.store.record(
                conn,
                transition,
                self._packet(transition),
                operation=operation,
                payload_json=dumps(payload),
                claimed_by=self.instance,
            )
        state = self._attempt(DueCall(transition.state, operation, payload))
        if state.status is Status.FAILED:
            raise CachedCallFailed(state)
        return CallResult(call_id, state.status)

    def http_call(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        target: str | None = None,
    ) -> CallResult:
        """A cached HTTP request (channel ``ApiOutbound``; ``target`` defaults to the URL).
        A 2xx answer delivers it; 4xx (but 408, 425, 429) fails it; anything else is
        transient. Raises as ``cached_call``."""
        payload = {"method": method, "url": url, "json": json, "headers": dict(headers or {})}
        return self.cached_call(target or url, HTTP_OPERATION, payload)

    def attempt_due(self, limit: int = 50) -> int:
        """Attempt up to ``limit`` buffered calls that are due; returns how many."""
        attempted = 0
        for call in self.store.due(self._clock(), limit):
            if self.store.claim(call.state, self.instance):
                self._attempt(call)
                attempted += 1
        return attempted

    def next_due_at(self) -> datetime | None:
        """When the next buffered call falls due (``None``: none waits)."""
        return self.store.next_due_at()

    # --- notifications --------------------------------------------------------------------
    def notify(
        self,
        target: str | None,
        subject: str,
        body: str = "",
        *,
        recipients: Sequence[str] | None = None,
        channel: str = "Email",
        severity: str = "Info",
        notification_id: str | None = None,
    ) -> str:
        """Send a notification through central: to ``target`` (a recipient list's name
        for ``Email``, a webhook's name for ``Webhook``, as central's settings name
        them) or, with ``target`` ``None``, by e-mail to ``recipients`` (plain addresses,
        at most ``MAX_RECIPIENTS``; central mails only the domains it allows this site),
        ``severity`` Info, Warning, Error or Critical. Stored before this returns
        and forwarded to central until it takes it (``controlroom.site.outbox``); returns
        its ``notification_id`` (a GUID, ``notification_id`` when given: the same id
        again stores nothing new).

        Raises ``ValueError`` naming each field at fault (``target`` or ``subject`` over
        256 characters, an unknown channel or severity, a NUL, an address that is not
        one plain address, a target and recipients both or neither): never truncated.
        """
        try:
            notification = SiteNotification.model_validate(
                {
                    "target": target,
                    "recipients": None if recipients is None else list(recipients),
                    "subject": subject,
                    "body": body,
                    "channel": channel,
                    "severity": severity,
                    "notification_id": notification_id,
                }
            )
        except ValidationError as error:
            raise ValueError(describe_errors(error)) from None
        return self.store_notification(notification)

    def store_notification(self, notification: SiteNotification) -> str:
        """Store a validated ``notification`` (``notify``); returns its id."""
        notification_id = notification.notification_id or str(uuid.uuid4())
        item = forwarded_item(
            notification, notification_id=notification_id, source_site=self.settings.site_id
        )
        self.store.add_notification(item, self._clock())
        return notification_id

    def purge_notifications(self) -> int:
        """Delete the notifications central settled more than
        ``notification_retention_days`` ago (``TrackingStore.purge_notifications``);
        returns how many went."""
        retention = timedelta(days=self.settings.notification_retention_days)
        return self.store.purge_notifications(self._clock() - retention)

    # --- operator commands ----------------------------------------------------------------
    def retry(self, tracked_operation_id: str, operator: str) -> CommandOutcome:
        """An operator's Retry of a Parked call: a new lifecycle (``epoch`` + 1), attempted
        by the retry loop. ``NotParked`` for a call in any other status. Raises
        ``ValueError`` naming ``operator`` when central would refuse it as an actor."""
        return self._command(tracked_operation_id, operator, lifecycle.operator_retry)

    def discard(self, tracked_operation_id: str, operator: str) -> CommandOutcome:
        """An operator's Discard of a Parked call (``Discarded``). Raises as ``retry``."""
        return self._command(tracked_operation_id, operator, lifecycle.operator_discard)

    def _command(
        self,
        tracked_operation_id: str,
        operator: str,
        decide: Callable[[CallState, Stamp], Transition | None],
    ) -> CommandOutcome:
        # The operator is the audit event's actor: a name central refuses is refused here,
        # before the command is applied and its audit record could be lost.
        check_actor(operator, "operator")
        with self.store.transition(self._clock()) as (conn, stamp):
            row = self.store.read(conn, tracked_operation_id)
            if row is None:
                return CommandOutcome.NOT_FOUND
            transition = decide(state_from_row(row), stamp)
            if transition is None:
                return CommandOutcome.NOT_PARKED
            self.store.record(conn, transition, self._packet(transition, actor=operator))
        return CommandOutcome.APPLIED

    # --- attempts -------------------------------------------------------------------------
    def _attempt(self, call: DueCall) -> CallState:
        """One attempt of a claimed call, and the transition it ends in."""
        operation = self._operations.get(call.operation)
        try:
            if operation is None:
                raise LookupError(f"no operation registered as {call.operation!r}")
            answer = operation(call.payload)
        except Exception as exc:
            failure = lifecycle.classify_failure(exc)
            return self._finish(
                call.state,
                lambda state, stamp: lifecycle.attempt_failed(
                    state,
                    failure,
                    stamp,
                    max_retries=self.settings.max_retries,
                    backoff_base=self.settings.backoff_base,
                    backoff_cap=self.settings.backoff_cap,
                ),
            )
        # The delivering answer's status, never a failed attempt's (docs/decisions.md "A
        # Delivered call's http_status is its delivering attempt's").
        http_status = answer.status_code if isinstance(answer, httpx.Response) else None
        return self._finish(
            call.state,
            lambda state, stamp: lifecycle.delivered(state, stamp, http_status=http_status),
        )

    def _finish(
        self, state: CallState, decide: Callable[[CallState, Stamp], Transition]
    ) -> CallState:
        with self.store.transition(self._clock()) as (conn, stamp):
            transition = decide(state, stamp)
            self.store.record(conn, transition, self._packet(transition), claimed_by=None)
        return transition.state

    def _http_attempt(self, payload: Mapping[str, Any]) -> httpx.Response:
        response = httpx.request(
            payload["method"],
            payload["url"],
            json=payload.get("json"),
            headers=payload.get("headers") or None,
            timeout=self.settings.attempt_timeout,
        )
        response.raise_for_status()
        return response

    def _packet(self, transition: Transition, *, actor: str | None = None) -> dict[str, Any]:
        return telemetry_packet(transition, event_id=str(uuid.uuid4()), actor=actor or self._actor)
