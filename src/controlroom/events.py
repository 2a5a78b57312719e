"""The event log: what happened, written in the transaction that did it.

Source: docs/design.md "Event log"; the shape is ServiceControl's ``EventLogItem`` (``id``,
``description``, ``severity``, ``raised_at``, ``related_to``, ``category``,
``event_type``), served at ``GET /api/eventlogitems``. Both halves write to it (the error
instance now; the site-call half later): ``record_event`` takes the caller's connection,
so an event commits or rolls back with the change it describes. Items older than
``event_log_retention_period`` are purged by the retention sweep (``purge_events``).
``subscribe`` lets a part of the process act on each event in its transaction (the
notification rules: docs/design.md "Notification rules"). ``report_intake_transition``
writes an intake's change of health (``IntakeStalled`` / ``IntakeRecovered``) for every
intake, the error queue's and the telemetry queue's alike; ``observe_intake`` and
``reporting_intake`` are the round of reporting both intakes run.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from controlroom.db.tables import event_log_items
from controlroom.db.transactions import begin_write
from controlroom.event_types import EventType
from controlroom.runtime.clock import utc_now
from controlroom.runtime.intake_health import IntakeHealth, IntakeState
from controlroom.transport.base import QueueDepth, Transport, TransportError

log = logging.getLogger(__name__)

ev = event_log_items.c


class Severity(enum.StrEnum):
    """ServiceControl's severities, as its JSON writes them."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


class Category(enum.StrEnum):
    """The categories Controlroom writes (ServiceControl's names where it has one)."""

    MESSAGE_FAILURES = "MessageFailures"
    RECOVERABILITY = "Recoverability"
    ENDPOINTS = "Endpoints"
    RETENTION = "Retention"
    FAILED_IMPORTS = "FailedImports"
    SITE_CALLS = "SiteCalls"
    NOTIFICATIONS = "Notifications"
    INGESTION = "Ingestion"


MAX_DESCRIPTION = 4000
"""Characters of a description kept; longer ones end with an ellipsis (descriptions are
written by Controlroom and quote user text only in part)."""


@dataclass(frozen=True, slots=True)
class EventLogItem:
    """One event. ``raised_at`` is UTC; ``related_to`` lists ServiceControl-style paths
    (``/message/<id>``, ``/endpoint/<name>``, ``/group/<id>``, ``/retry/<operation id>``)."""

    id: str
    description: str
    severity: Severity
    raised_at: datetime
    related_to: tuple[str, ...]
    category: str
    event_type: str


EventHook = Callable[[sa.Connection, EventLogItem], None]
"""Called with each event ``record_event`` writes, in the writer's transaction."""

_hooks: weakref.WeakKeyDictionary[sa.Engine, list[EventHook]] = weakref.WeakKeyDictionary()


def subscribe(engine: sa.Engine, hook: EventHook) -> Callable[[], None]:
    """Call ``hook`` with every event recorded on ``engine`` from now on, in the same
    transaction (what it writes commits or rolls back with the event; an exception it
    raises fails the event's write). Answers the function that unsubscribes it."""
    hooks = _hooks.setdefault(engine, [])
    hooks.append(hook)
    return lambda: hooks.remove(hook)


def record_event(
    conn: sa.Connection,
    *,
    description: str,
    severity: Severity | str,
    category: Category | str,
    event_type: EventType,
    raised_at: datetime,
    related_to: Sequence[str] = (),
) -> str:
    """Write one event in the caller's transaction; returns its id (a new UUID).

    ``event_type`` names what happened, one of ``EventType`` (the one list of kinds the
    rules' settings are checked against); ``raised_at`` must be timezone-aware (UTC).
    Raises ``ValueError`` for an unknown severity or event type, or an empty
    ``category``.
    """
    level = Severity(severity)
    kind = EventType(event_type)
    if not category:
        raise ValueError("an event needs a category")
    if len(description) > MAX_DESCRIPTION:
        description = description[: MAX_DESCRIPTION - 1] + "…"
    event_id = str(uuid.uuid4())
    conn.execute(
        sa.insert(event_log_items).values(
            id=event_id,
            description=description,
            severity=str(level),
            category=str(category),
            event_type=str(kind),
            related_to_json=json.dumps(list(related_to)),
            raised_at=raised_at,
        )
    )
    hooks = _hooks.get(conn.engine)
    if hooks:
        item = EventLogItem(
            event_id, description, level, raised_at, tuple(related_to), str(category), str(kind)
        )
        for hook in list(hooks):
            hook(conn, item)
    return event_id


@dataclass(frozen=True, slots=True)
class EventPage:
    items: list[EventLogItem]
    total: int


def list_events(conn: sa.Connection, *, offset: int, limit: int) -> EventPage:
    """Events newest first (``raised_at`` descending, then id), one page, with the total."""
    total = conn.execute(sa.select(sa.func.count()).select_from(event_log_items)).scalar_one()
    rows = conn.execute(
        sa.select(event_log_items).order_by(ev.raised_at.desc(), ev.id).offset(offset).limit(limit)
    ).all()
    return EventPage(items=[_item(row) for row in rows], total=total)


def purge_events(conn: sa.Connection, *, older_than: datetime) -> int:
    """Delete events raised before ``older_than`` (UTC); returns how many."""
    return conn.execute(sa.delete(event_log_items).where(ev.raised_at < older_than)).rowcount


def _item(row: sa.Row[*tuple[Any, ...]]) -> EventLogItem:
    return EventLogItem(
        id=row.id,
        description=row.description,
        severity=Severity(row.severity),
        raised_at=row.raised_at,
        related_to=tuple(json.loads(row.related_to_json)),
        category=row.category,
        event_type=row.event_type,
    )


def message_path(failed_message_id: str) -> str:
    """The ``related_to`` entry of a failed message."""
    return f"/message/{failed_message_id}"


def endpoint_path(endpoint: str) -> str:
    """The ``related_to`` entry of an endpoint, by its name."""
    return f"/endpoint/{endpoint}"


def group_path(group_id: str) -> str:
    """The ``related_to`` entry of a failure group."""
    return f"/group/{group_id}"


def site_path(site_id: str) -> str:
    """The ``related_to`` entry of a site."""
    return f"/site/{site_id}"


def intake_path(queue: str) -> str:
    """The ``related_to`` entry of an intake, by its queue."""
    return f"/queue/{queue}"


SEVERITY_ORDER: tuple[Severity, ...] = tuple(Severity)
"""Severities from the least to the most severe."""


def at_least(severity: Severity, floor: Severity | str) -> bool:
    """``severity`` is ``floor`` or more severe."""
    return SEVERITY_ORDER.index(severity) >= SEVERITY_ORDER.index(Severity(floor))


def intake_changed(
    conn: sa.Connection, *, intake: str, queue: str, reason: str | None, now: datetime
) -> None:
    """An intake became degraded (``reason`` says why: a stall or failing writes) or
    stores again (``reason`` ``None``)."""
    record_event(
        conn,
        description=reason if reason is not None else f"{intake}: storing {queue} again",
        severity=Severity.ERROR if reason is not None else Severity.INFO,
        category=Category.INGESTION,
        event_type=EventType.INTAKE_STALLED if reason is not None else EventType.INTAKE_RECOVERED,
        raised_at=now,
        related_to=[intake_path(queue)],
    )


def resume_intake_reports(engine: sa.Engine, healths: Sequence[IntakeHealth]) -> None:
    """At start, before any report: each of ``healths`` takes the last
    ``IntakeStalled``/``IntakeRecovered`` of its queue in the event log as the change
    last reported (``IntakeHealth.resume``), so a stall an earlier serve stopped during
    is followed by ``IntakeRecovered`` once the intake stores again (docs/design.md
    "Notification rules")."""
    changes = (str(EventType.INTAKE_STALLED), str(EventType.INTAKE_RECOVERED))
    with engine.connect() as conn:
        for health in healths:
            last = conn.execute(
                sa.select(event_log_items.c.event_type)
                .where(event_log_items.c.event_type.in_(changes))
                .where(event_log_items.c.related_to_json == json.dumps([intake_path(health.queue)]))
                .order_by(event_log_items.c.raised_at.desc())
                .limit(1)
            ).scalar()
            health.resume(degraded=last == str(EventType.INTAKE_STALLED))


def report_intake_transition(engine: sa.Engine, health: IntakeHealth) -> bool:
    """Write ``IntakeStalled`` or ``IntakeRecovered`` when ``health`` changed since the
    last one written (``IntakeHealth.transition``); ``True`` when it wrote one. A store
    that refuses the write (e.g. a full disk, which refuses the event log as it refuses
    the intake) is logged, and a later call writes the change once it takes writes
    again; a stall whose ``IntakeStalled`` was refused, and which has ended by then, is
    written first (``IntakeHealth.unreported_stall``: raised at the time it was seen,
    saying when it began and that it is written late), then ``IntakeRecovered``, in one
    transaction, so the rules' notifications of both go out then (docs/design.md
    "Notification rules")."""
    state = health.transition()
    if state is None:
        return False
    missed = None if state.degraded else health.unreported_stall()
    now = state.observed_at or utc_now()
    try:
        with begin_write(engine) as conn:
            if missed is not None:
                stall_written_late(conn, missed, ended_at=now)
            intake_changed(conn, intake=state.name, queue=state.queue, reason=state.reason, now=now)
    except sa.exc.DBAPIError as exc:
        log.warning("cannot write the change of %s to the event log: %s", state.name, exc)
        return False
    health.reported(state)
    return True


def stall_written_late(conn: sa.Connection, stall: IntakeState, *, ended_at: datetime) -> None:
    """``IntakeStalled`` of a ``stall`` the store refused to record while it lasted
    (its ``since``, when it was seen: its ``observed_at``, the item's time), written once
    the store takes writes again, when the stall ended at ``ended_at``."""
    seen = stall.observed_at or ended_at
    began = (stall.since or seen).isoformat()
    intake_changed(
        conn,
        intake=stall.name,
        queue=stall.queue,
        reason=(
            f"{stall.reason} (degraded from {began} until {ended_at.isoformat()}; written "
            "late: the store refused writes meanwhile)"
        ),
        now=seen,
    )


async def observe_intake(
    engine: sa.Engine, transport: Transport, health: IntakeHealth
) -> QueueDepth | None:
    """Read the depth of ``health.queue`` into ``health``, then write a change of health
    to the event log (``report_intake_transition``, on a worker thread). Returns the depth
    read, or ``None`` when the transport cannot answer (``TransportError``: logged as a
    warning, and ``health`` keeps the depth it had)."""
    depth: QueueDepth | None = None
    try:
        depth = await transport.queue_depth(health.queue)
    except TransportError as exc:
        log.warning("cannot read the depth of %s: %s", health.queue, exc)
    else:
        health.observed_depth(depth.messages)
    await asyncio.to_thread(report_intake_transition, engine, health)
    return depth


async def report_intakes(
    engine: sa.Engine, healths: Sequence[IntakeHealth], seconds: float
) -> None:
    """Every ``seconds`` until cancelled, write each of ``healths``' changes
    (``report_intake_transition``, on a worker thread). Serve runs it for the intakes of
    its worker processes, whose reports its own ``IntakeHealth`` applies (``workers``):
    a worker's ``observe_intake`` leaves the event log to serve. Whatever a round raises
    is logged as a warning and the next round tries again."""
    while True:
        await asyncio.sleep(seconds)
        for health in healths:
            try:
                await asyncio.to_thread(report_intake_transition, engine, health)
            except Exception:  # the next round tries again
                log.warning("could not report on the %s", health.name, exc_info=True)


class SinceLastReport:
    """An intake's counts by outcome since its last report line, and when that was: read
    and started again by ``take``, at each report and once more at the intake's stop, so
    that its lines add up to what it stored (docs/decisions.md "serve says what it is
    doing"). Used on the intake's event loop only."""

    def __init__(self, *outcomes: str) -> None:
        self.counts = dict.fromkeys(outcomes, 0)
        self._since = time.monotonic()

    def take(self) -> tuple[dict[str, int], float]:
        """The counts since the last ``take`` and the seconds since then (at least 1 ms),
        starting both again."""
        counts, self.counts = self.counts, dict.fromkeys(self.counts, 0)
        now = time.monotonic()
        seconds, self._since = max(now - self._since, 1e-3), now
        return counts, seconds


@contextlib.asynccontextmanager
async def reporting_intake(
    seconds: float, report: Callable[[], Awaitable[None]], *, intake: str
) -> AsyncIterator[None]:
    """For the block: await ``report()`` every ``seconds`` in a task of its own, which
    the block's end cancels. Whatever ``report()`` raises is logged (a warning naming
    ``intake``) and the next round tries again."""

    async def every() -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await report()
            except Exception:  # the next round tries again
                log.warning("could not report on the %s", intake, exc_info=True)

    reporter = asyncio.create_task(every())
    try:
        yield
    finally:
        reporter.cancel()
