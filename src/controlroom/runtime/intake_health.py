"""Is an intake storing what its queue holds? (docs/design.md "Operational contract").

A stuck intake loses nothing (its messages stay unacknowledged in the queue) but does no
work: a full disk or body store, a read-only database. ``IntakeHealth`` is what one intake
(the error queue's, the telemetry queue's) tells ``GET /api/health`` and ``/metrics``:
the intake calls ``stored()`` after each committed batch, ``failed(reason)`` when a write
fails, and ``observed_depth(messages)`` when it learns its queue's depth (the health
route samples it too). It is *degraded* while

- its writes fail: the last write attempt failed, and none has succeeded since;
- its worker process ended while serve ran (``worker_ended``), until the worker started
  in its place has run long enough to count as running (``worker_running``): an intake
  whose worker fails in a loop stores nothing, with an empty queue too; or
- it stalls: its queue has held messages for ``stall_seconds`` without a batch stored.

Times are monotonic seconds for the rules, UTC for the answer.

The event log hears of a change once (``transition``, then ``reported`` once written).
When the store refuses that write too (a full disk refuses every write), the first
degraded state seen is kept (``unreported_stall``), so the stall is written, late, before
the recovery once the store takes writes again (docs/design.md "Notification rules").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from prometheus_client import Gauge

from controlroom.runtime.clock import utc_now

DEGRADED = Gauge(
    "controlroom_intake_degraded",
    "1 while an intake's writes fail, its worker process is being started again after it "
    "ended, or its queue has held messages for the stall time without a batch stored, else 0",
    ["intake"],
)
WRITE_FAILURES = Gauge(
    "controlroom_intake_write_failures",
    "Write attempts of an intake that failed since its last stored batch",
    ["intake"],
)
LAST_STORED = Gauge(
    "controlroom_intake_last_stored_timestamp_seconds",
    "Unix time of an intake's last stored batch (absent before the first)",
    ["intake"],
)


@dataclass(frozen=True, slots=True)
class IntakeState:
    """An intake as health reports it: ``reason`` is ``None`` when healthy, else one
    sentence (never message data); ``last_stored_at`` UTC or ``None`` before the first
    batch; ``waiting`` the messages last seen in its queue (``None``: never seen);
    ``since`` and ``observed_at`` below."""

    name: str
    queue: str
    reason: str | None
    last_stored_at: datetime | None
    write_failures: int
    waiting: int | None
    since: datetime | None = None
    """UTC: when the degradation began (writes first failed; messages first waited with
    none stored); ``None`` when healthy."""
    observed_at: datetime | None = None
    """UTC: when this state was read."""
    waiting_at: datetime | None = None
    """UTC: when ``waiting`` was seen (``None``: never)."""

    @property
    def degraded(self) -> bool:
        return self.reason is not None


class IntakeHealth:
    """What one intake did lately (module docstring). Thread-safe: the writer reports
    from worker threads, the health route reads on the event loop."""

    def __init__(
        self,
        name: str,
        queue: str,
        *,
        stall_seconds: float,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.name = name
        self.queue = queue
        self._stall_seconds = stall_seconds
        self._monotonic = monotonic
        self._clock = clock
        self._lock = threading.Lock()
        self._last_stored_at: datetime | None = None
        self._failures = 0
        self._failing_since: datetime | None = None
        self._failure_reason = ""
        self._waiting: int | None = None
        self._waiting_at: datetime | None = None
        self._waiting_since: float | None = None  # monotonic: messages seen, none stored since
        self._ended: dict[int, tuple[str, datetime]] = {}  # worker: why, since (UTC)
        self._reported_degraded = False
        self._unreported: IntakeState | None = None  # a degraded state not yet written

    def stored(self) -> None:
        """A batch was committed: writes work, and the stall clock starts again."""
        with self._lock:
            self._last_stored_at = self._clock()
            self._failures = 0
            self._failing_since = None
            if self._waiting_since is not None:
                self._waiting_since = self._monotonic()
        LAST_STORED.labels(self.name).set(self._last_stored_at.timestamp())
        self.state()

    def failed(self, reason: str) -> None:
        """A write attempt failed for ``reason`` (one line, no message data)."""
        with self._lock:
            self._failures += 1
            self._failure_reason = reason
            if self._failing_since is None:
                self._failing_since = self._clock()
        self.state()

    def worker_ended(self, worker: int, reason: str) -> None:
        """Intake worker ``worker`` ended while serve ran, for ``reason`` (one line); serve
        starts it again. Degraded until ``worker_running(worker)``."""
        with self._lock:
            _, since = self._ended.get(worker, (reason, self._clock()))
            self._ended[worker] = (reason, since)
        self.state()

    def worker_running(self, worker: int) -> None:
        """Intake worker ``worker``, started after it ended, has run long enough to count
        as running."""
        with self._lock:
            self._ended.pop(worker, None)
        self.state()

    def observed_depth(self, messages: int) -> None:
        """The queue holds ``messages`` ready messages now."""
        with self._lock:
            self._waiting = messages
            self._waiting_at = self._clock()
            if messages <= 0:
                self._waiting_since = None
            elif self._waiting_since is None:
                self._waiting_since = self._monotonic()
        self.state()

    def state(self) -> IntakeState:
        """The intake now; also sets its gauges."""
        with self._lock:
            reason, since = self._reason()
            state = IntakeState(
                name=self.name,
                queue=self.queue,
                reason=reason,
                last_stored_at=self._last_stored_at,
                write_failures=self._failures,
                waiting=self._waiting,
                since=since,
                observed_at=self._clock(),
                waiting_at=self._waiting_at,
            )
        DEGRADED.labels(self.name).set(1 if state.degraded else 0)
        WRITE_FAILURES.labels(self.name).set(state.write_failures)
        return state

    def transition(self) -> IntakeState | None:
        """The intake now if it became degraded, or healthy again, since the last state
        ``reported``, or healthy with a stall never reported (``unreported_stall``);
        ``None`` otherwise (an event is raised on a change only)."""
        state = self.state()
        with self._lock:
            if state.degraded and not self._reported_degraded and self._unreported is None:
                self._unreported = state
            changed = state.degraded != self._reported_degraded
            missed = not state.degraded and self._unreported is not None
            return state if changed or missed else None

    def unreported_stall(self) -> IntakeState | None:
        """The first degraded state ``transition`` answered since the last state
        ``reported``, when that degradation was never reported (its write refused);
        ``None`` otherwise. Its reporter writes it once the intake is healthy again
        (``events.report_intake_transition``). Kept in memory only: a restart forgets
        it."""
        with self._lock:
            return None if self._reported_degraded else self._unreported

    def resume(self, *, degraded: bool) -> None:
        """At start: the last change written for this intake (by an earlier serve) was a
        degradation (``degraded``) or a recovery; a degradation it never saw end makes the
        first healthy ``transition`` a change (``events.resume_intake_reports``)."""
        with self._lock:
            self._reported_degraded = degraded

    def reported(self, state: IntakeState) -> None:
        """``state``'s change was written to the event log (``transition``), with the
        unreported stall before it if there was one."""
        with self._lock:
            self._reported_degraded = state.degraded
            self._unreported = None

    def _reason(self) -> tuple[str | None, datetime | None]:
        """Why the intake is degraded and since when (UTC), or ``(None, None)``."""
        if self._failing_since is not None:
            return (
                f"{self.name}: writes failing since {self._failing_since.isoformat()} "
                f"({self._failures} attempts; last: {self._failure_reason}); the messages "
                f"stay in {self.queue}"
            ), self._failing_since
        if self._ended:
            worker = min(self._ended)
            reason, since = self._ended[worker]
            return (
                f"{self.name}: {reason} at {since.isoformat()} and is being started again; "
                f"the messages stay in {self.queue}"
            ), since
        if self._waiting_since is None:
            return None, None
        stalled = self._monotonic() - self._waiting_since
        if stalled < self._stall_seconds:
            return None, None
        return (
            f"{self.name}: nothing stored for {stalled:.0f} s although {self.queue} holds "
            f"{self._waiting} messages"
        ), self._clock() - timedelta(seconds=stalled)
