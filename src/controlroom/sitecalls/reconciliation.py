"""Reconciliation: central pulls what changed at each site and converges its mirror to it.

Source: docs/design.md "Reconciliation"; docs/decisions.md "The site is the source of
truth, and central pulls". The site is the source of truth and
telemetry is best effort, so a pass pulls each configured site's rows changed since its
persisted cursor (``site_reconciliation``), in pages of ``reconciliation.batch_size`` up
to ``max_pages_per_pass``, and writes every row through the same writer and monotonic
upsert as telemetry (a row the contract refuses is kept in ``rejected_telemetry``). The
cursor rules, and when a site is pinned, are ``controlroom.sitecalls.cursor``.

A pass pulls its sites concurrently, one thread each; a site that errs or times out ends
its own part with ``last_error`` and leaves the others alone. Each page's write is its own
transaction on its own pooled connection, and nothing is held open while a site is slow,
so the API and ingest keep answering during a long pass. The cursor only moves forward
(a guarded upsert), so it never moves back whatever runs beside a pass.

A site that failed to answer is *unreachable*; a pass that failed because central's own
store refused or timed out (the site answered) leaves the site reachable, and its error
names the store (``db.errors.describe_store_error``: never the statement's text).

One pass at a time per deployment: every pass, scheduled or on demand, holds the pass
lease (``PASS_LEASE_NAME``) for its duration, so a second process asked for a pass while
one runs anywhere answers that it runs elsewhere (the API's 409). The scheduled passes
also need the schedule lease (``ReconciliationService.LEASE_NAME``), so one process
schedules them.

The pinned latch's transitions are recorded in ``site_reconciliation``
(``pinned``, ``pinned_changed_at_utc``) by a conditional update from the state the pass
read: only the pass whose update changed the row raises the transition's event log item
(``SitePinned``, ``SiteUnpinned``, in the same transaction) and logs it, so a transition
is recorded once across processes.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
import sqlalchemy as sa

from controlroom.config import ConfiguredSite, Settings
from controlroom.db.errors import describe_store_error
from controlroom.db.providers import provider_for
from controlroom.db.tables import site_reconciliation
from controlroom.db.transactions import begin_write
from controlroom.event_types import EventType
from controlroom.events import Category, Severity, record_event, site_path
from controlroom.runtime.clock import Clock, utc_now
from controlroom.runtime.periodic import PeriodicTask
from controlroom.sitecalls.cursor import Cursor, PinChange, judge_page, pin_change
from controlroom.sitecalls.intake import make_writer, receive_json
from controlroom.sitecalls.site_requests import (
    MAX_PAGE_BYTES,
    AnswerTooLarge,
    SiteAnswerError,
    request_site,
)
from controlroom.sitecalls.writer import ReceivedPacket, SiteCallWriter
from controlroom.telemetry.contract import foreign_source
from controlroom.telemetry.stamps import Stamp, stamp_of, stamp_values

log = logging.getLogger(__name__)

CHANGES_PATH = "/site/tracking/changes"
WRITE_ATTEMPTS = 3
MAX_CONCURRENT_SITES = 8
PULLED_FROM = "reconciliation:"
"""The source of a row pulled from a site (``rejected_telemetry.source``), before the
site's id."""
PASS_LEASE_NAME = "site-reconciliation-pass"
"""The lease every pass holds while it runs, in whichever process runs it."""
sr = site_reconciliation.c


class SitePullError(Exception):
    """A site did not answer a page usably (unreachable, timeout, an error answer, or a
    body that is not the pull contract)."""


@dataclass(frozen=True, slots=True)
class SitePassResult:
    """What a pass did for one site."""

    site_id: str
    pages: int
    rows: int
    error: str | None
    pinned: bool


def site_headers(site: ConfiguredSite) -> dict[str, str]:
    """The headers central presents to ``site``'s agent."""
    if site.token is None:
        return {}
    return {"Authorization": f"Bearer {site.token.get_secret_value()}"}


def pull_page(
    site: ConfiguredSite, cursor: Cursor | None, limit: int, timeout: float
) -> tuple[list[dict[str, Any]], bool]:
    """One page of the pull contract from ``cursor``, its whole answer within ``timeout``
    seconds and ``site_requests.MAX_PAGE_BYTES``. Raises ``SitePullError``. Blocking (a
    pass's own thread): the request runs on an event loop of its own."""
    params: dict[str, Any] = {"limit": limit}
    if cursor is not None:
        params["since"] = cursor[0].isoformat()
        params["after_id"] = cursor[1]
    request = request_site(
        "GET",
        site.base_url.rstrip("/") + CHANGES_PATH,
        headers=site_headers(site),
        params=params,
        timeout=timeout,
        max_bytes=MAX_PAGE_BYTES,
    )
    try:
        response = asyncio.run(request)
    except AnswerTooLarge as exc:
        raise SitePullError(f"answered more than a page of the pull contract: {exc}") from exc
    except (httpx.HTTPError, SiteAnswerError) as exc:
        raise SitePullError(f"unreachable: {type(exc).__name__}: {exc}") from exc
    if not response.is_success:
        raise SitePullError(f"answered HTTP {response.status_code}: {response.text(200)}")
    try:
        body = response.json()
        rows, more = body["rows"], body["more_available"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SitePullError(f"answered something that is not the pull contract: {exc}") from exc
    if not isinstance(rows, list) or not isinstance(more, bool):
        raise SitePullError("answered something that is not the pull contract")
    return rows, more


def _key(row: Any) -> Cursor | None:
    """A row's place in the site's order (its stamp to 100 ns), ``None`` when it does not
    say: no stamp, no id, or a stamp the contract refuses (no zone, finer than 100 ns, a
    time no store holds)."""
    try:
        stamp = Stamp.parse(row["updated_at_utc"])
        ident = row["tracked_operation_id"]
    except (TypeError, KeyError, ValueError):
        return None
    return (stamp, ident) if isinstance(ident, str) else None


def receive_row(row: Any, site: ConfiguredSite) -> ReceivedPacket:
    """A pulled row as a packet of the contract, refused when it names another site."""
    received = receive_json(row, f"{PULLED_FROM}{site.id}")
    packet = received.packet
    reason = None if packet is None else foreign_source(packet.source_site, site.id)
    if reason is not None:
        return ReceivedPacket(raw=received.raw, source=received.source, rejected_because=reason)
    return received


class Reconciler:
    """Runs passes over the configured sites (blocking; see the module doc)."""

    def __init__(
        self,
        settings: Settings,
        engine: sa.Engine,
        *,
        writer: SiteCallWriter | None = None,
        clock: Clock = utc_now,
    ) -> None:
        self._settings = settings
        self._config = settings.reconciliation
        self._engine = engine
        self._provider = provider_for(engine)
        # A store that keeps failing fails this site's pass (retried next pass), rather
        # than holding the pass forever.
        self._writer = writer or make_writer(settings, engine, attempts=WRITE_ATTEMPTS)
        self._clock = clock

    def run_pass(self, sites: Sequence[ConfiguredSite] | None = None) -> list[SitePassResult]:
        """Reconcile ``sites`` (all configured ones by default), concurrently."""
        sites = list(self._settings.sites if sites is None else sites)
        if not sites:
            return []
        workers = min(len(sites), MAX_CONCURRENT_SITES)
        with ThreadPoolExecutor(workers, thread_name_prefix="reconcile") as pool:
            return list(pool.map(self._reconcile_alone, sites))

    def _reconcile_alone(self, site: ConfiguredSite) -> SitePassResult:
        """``reconcile_site``, whose unexpected failure (its store state unreadable or
        unwritable) is this site's result and never the other sites'."""
        try:
            return self.reconcile_site(site)
        except Exception as exc:
            log.exception("reconciliation of site %s failed", site.id)
            return SitePassResult(site.id, 0, 0, f"{type(exc).__name__}: {exc}", False)

    def reconcile_site(self, site: ConfiguredSite) -> SitePassResult:
        """Pull ``site`` from its stored cursor up to the page ceiling; never raises for
        the site's own failures (they are its ``last_error``). The site is recorded
        reachable when it answered, unreachable when it did not; a pass that central's
        store failed after the site answered says so and leaves the site reachable."""
        state = self._load(site.id)
        cursor = state["cursor"]
        pages = rows = 0
        stuck = progressed = False
        error = None
        reachable: bool | None = None  # unknown until the site answers or fails to
        try:
            while pages < self._config.max_pages_per_pass:
                page, more = pull_page(
                    site, cursor, self._config.batch_size, self._config.request_timeout
                )
                reachable = True
                pages += 1
                rows += len(page)
                self._writer.write([receive_row(row, site) for row in page])
                keys = [key for key in map(_key, page) if key is not None]
                verdict = judge_page(cursor, keys, more)
                if verdict.advanced:
                    cursor = verdict.cursor
                    assert cursor is not None  # advanced: the page had a key past the old one
                    self._advance_cursor(site.id, cursor)
                    progressed = True
                if verdict.stuck:
                    stuck = True
                    break
                if not more:
                    progressed = True
                    break
        except SitePullError as exc:
            reachable = False
            error = f"site {site.id} {exc}"
        except Exception as exc:  # central's store or a bug: this site's pass only
            log.exception("reconciliation of site %s failed", site.id)
            error = (
                f"central's store failed while reconciling site {site.id} "
                f"(the site {'answered' if reachable else 'was not asked'}): "
                f"{describe_store_error(exc)}"
            )
        if error is not None:
            log.warning("reconciliation: %s", error)
        was_pinned = state["pinned"]
        change = None if error else pin_change(was_pinned, stuck=stuck, progressed=progressed)
        pinned = was_pinned if change is None else change is PinChange.LATCHED
        self._record_pass(site.id, rows, error, reachable, (was_pinned, change), cursor)
        return SitePassResult(site.id, pages, rows, error, pinned)

    # --- the site's stored state ----------------------------------------------------------
    def _load(self, site_id: str) -> dict[str, Any]:
        with self._engine.connect() as conn:
            row = conn.execute(sa.select(site_reconciliation).where(sr.site_id == site_id)).first()
        cursor = None
        if row is not None and (stamp := stamp_of(row, "cursor_updated_at")) is not None:
            cursor = (stamp, row.cursor_tracked_operation_id)
        return {"cursor": cursor, "pinned": bool(row.pinned) if row is not None else False}

    def _advance_cursor(self, site_id: str, cursor: Cursor) -> None:
        """Store ``cursor`` unless the stored one is already past it."""
        stamp, ident = cursor
        statement = self._provider.upsert(
            site_reconciliation,
            key=[sr.site_id],
            set_=lambda incoming: {
                "cursor_updated_at_utc": incoming.cursor_updated_at_utc,
                "cursor_updated_at_tick": incoming.cursor_updated_at_tick,
                "cursor_tracked_operation_id": incoming.cursor_tracked_operation_id,
            },
            where=lambda incoming: sa.or_(
                sr.cursor_updated_at_utc.is_(None),
                sa.tuple_(
                    incoming.cursor_updated_at_utc,
                    incoming.cursor_updated_at_tick,
                    incoming.cursor_tracked_operation_id,
                )
                > sa.tuple_(
                    sr.cursor_updated_at_utc,
                    sr.cursor_updated_at_tick,
                    sr.cursor_tracked_operation_id,
                ),
            ),
        ).values(
            site_id=site_id,
            **stamp_values("cursor_updated_at", stamp),
            cursor_tracked_operation_id=ident,
            reachable=True,
            pinned=False,
            rows_pulled=0,
        )
        with begin_write(self._engine) as conn:
            conn.execute(statement)

    def _record_pass(
        self,
        site_id: str,
        rows: int,
        error: str | None,
        reachable: bool | None,
        pin: tuple[bool, PinChange | None],
        cursor: Cursor | None,
    ) -> None:
        """The pass's outcome (``reachable`` ``None``: as stored) with ``SiteUnreachable``
        / ``SiteReachable`` when it changed (a site never reached before is unreachable
        from its first failed pass), and the pin change
        from the state the pass read (``pin``: was pinned, the change) with its event,
        in one transaction. The change is a conditional update of the stored latch: when
        another process recorded the same transition first, it changes nothing here and
        no second event is raised."""
        now = self._clock()
        values: dict[str, Any] = {"last_pull_at_utc": now, "last_error": error}
        if reachable is not None:
            values["reachable"] = reachable
        if error is None:
            values["last_success_at_utc"] = now
        statement = self._provider.upsert(
            site_reconciliation,
            key=[sr.site_id],
            set_=lambda incoming: {
                **{name: getattr(incoming, name) for name in values},
                "rows_pulled": sr.rows_pulled + incoming.rows_pulled,
            },
        ).values(
            site_id=site_id,
            rows_pulled=rows,
            pinned=False,
            **{"reachable": bool(reachable), **values},
        )
        was_pinned, change = pin
        with begin_write(self._engine) as conn:
            if reachable is not None and _reachability_changed(conn, site_id, reachable):
                _record_reachability(conn, site_id, reachable, error, now)
            conn.execute(statement)
            if change is None:
                return
            flipped = conn.execute(
                sa.update(site_reconciliation)
                .where(sr.site_id == site_id, sr.pinned == was_pinned)
                .values(pinned=change is PinChange.LATCHED, pinned_changed_at_utc=now)
            ).rowcount
            if flipped:
                _record_pin_change(conn, site_id, change, cursor, now)


def _reachability_changed(conn: sa.Connection, site_id: str, reachable: bool) -> bool:
    """Flip the stored ``reachable`` of ``site_id`` to ``reachable`` with a conditional
    update; ``True`` when it changed, or when a site without a row is unreachable."""
    flipped = conn.execute(
        sa.update(site_reconciliation)
        .where(sr.site_id == site_id, sr.reachable == (not reachable))
        .values(reachable=reachable)
    ).rowcount
    if flipped or reachable:
        return bool(flipped)
    known = conn.execute(sa.select(sr.site_id).where(sr.site_id == site_id)).first()
    return known is None


def _record_reachability(
    conn: sa.Connection, site_id: str, reachable: bool, error: str | None, now: datetime
) -> None:
    """Raise ``SiteUnreachable`` (with the pass's error) or ``SiteReachable`` ("again"
    when the site answered a pass before; read before this pass records its success)."""
    if reachable:
        answered_before = conn.execute(
            sa.select(sr.last_success_at_utc).where(sr.site_id == site_id)
        ).scalar()
        again = " again" if answered_before is not None else ""
        description = f"Site {site_id} answers reconciliation{again}"
        _site_event(conn, site_id, Severity.INFO, EventType.SITE_REACHABLE, description, now)
    else:
        description = f"Site {site_id} is unreachable: {error}"
        _site_event(conn, site_id, Severity.ERROR, EventType.SITE_UNREACHABLE, description, now)


def _site_event(
    conn: sa.Connection,
    site_id: str,
    severity: Severity,
    event_type: EventType,
    description: str,
    now: datetime,
) -> None:
    record_event(
        conn,
        description=description,
        severity=severity,
        category=Category.SITE_CALLS,
        event_type=event_type,
        raised_at=now,
        related_to=[site_path(site_id)],
    )


def _record_pin_change(
    conn: sa.Connection, site_id: str, change: PinChange, cursor: Cursor | None, now: datetime
) -> None:
    """Raise the event of a pinned latch's transition (once per transition) in the
    transaction that records it: an event log item (``SitePinned`` / ``SiteUnpinned``)
    and a log line."""
    at = f"{cursor[0].isoformat()} / {cursor[1]}" if cursor else "the start"
    if change is PinChange.LATCHED:
        description = (
            f"Site {site_id} is pinned: it keeps reporting more rows at cursor {at} but none "
            "past it (a site without after_id support, with more rows sharing one "
            "updated_at_utc than a page of reconciliation.batch_size holds)"
        )
        log.warning("%s", description)
        severity, event_type = Severity.WARNING, EventType.SITE_PINNED
    else:
        description = f"Site {site_id} is no longer pinned: reconciliation advanced to {at}"
        log.info("%s", description)
        severity, event_type = Severity.INFO, EventType.SITE_UNPINNED
    _site_event(conn, site_id, severity, event_type, description, now)


@dataclass(frozen=True, slots=True)
class SiteState:
    """A configured site and its reconciliation state (``site_reconciliation``): the last
    pull and last success (UTC), the cursor (``None`` before the first row), whether it is
    pinned and since when, the last error, whether the last pass reached it (``None``
    before any pass) and the rows pulled so far."""

    id: str
    base_url: str
    last_pull_at_utc: datetime | None
    last_success_at_utc: datetime | None
    cursor: Cursor | None
    pinned: bool
    pinned_changed_at_utc: datetime | None
    last_error: str | None
    reachable: bool | None
    rows_pulled: int


def reconciliation_lag(state: SiteState, now: datetime) -> float | None:
    """Seconds since ``state``'s site was last reconciled with success (``None`` before
    its first successful pass): how stale the mirror may be where telemetry was lost."""
    if state.last_success_at_utc is None:
        return None
    return max(0.0, (now - state.last_success_at_utc).total_seconds())


def site_warnings(state: SiteState, now: datetime, interval: timedelta) -> list[str]:
    """What is wrong with a site's reconciliation, one sentence each (never the site's
    address or error text: the health endpoint that shows them is open): pinned,
    unreachable, or not reconciled for more than twice ``interval``."""
    warnings = []
    if state.pinned:
        warnings.append(
            f"site {state.id} is pinned: reconciliation cannot advance past one "
            "updated_at_utc (see GET /api/sites)"
        )
    if state.reachable is False:
        warnings.append(f"site {state.id} is unreachable: its last reconciliation pass failed")
    lag = reconciliation_lag(state, now)
    if state.last_pull_at_utc is not None and (lag is None or lag > 2 * interval.total_seconds()):
        when = "never been reconciled" if lag is None else f"not been reconciled for {lag:.0f} s"
        warnings.append(
            f"site {state.id} has {when} (reconciliation.interval is "
            f"{interval.total_seconds():g} s)"
        )
    return warnings


def site_states(conn: sa.Connection, sites: Sequence[ConfiguredSite]) -> list[SiteState]:
    """The state of each of ``sites`` (in their order); a site never pulled has an empty
    state. Never the site's token."""
    states = {row.site_id: row for row in conn.execute(sa.select(site_reconciliation))}
    answer = []
    for site in sites:
        state = states.get(site.id)
        cursor = None
        if state is not None and (stamp := stamp_of(state, "cursor_updated_at")) is not None:
            cursor = (stamp, state.cursor_tracked_operation_id)
        answer.append(
            SiteState(
                id=site.id,
                base_url=site.base_url,
                last_pull_at_utc=state.last_pull_at_utc if state else None,
                last_success_at_utc=state.last_success_at_utc if state else None,
                cursor=cursor,
                pinned=bool(state.pinned) if state else False,
                pinned_changed_at_utc=state.pinned_changed_at_utc if state else None,
                last_error=state.last_error if state else None,
                reachable=bool(state.reachable) if state else None,
                rows_pulled=state.rows_pulled if state else 0,
            )
        )
    return answer


class PassStart(enum.Enum):
    """Whether a pass asked for started, or why not."""

    STARTED = "started"
    RUNNING_HERE = "running here"
    """This process runs a pass (single-flight)."""
    RUNNING_ELSEWHERE = "running elsewhere"
    """Another process holds the pass lease: it runs a pass now."""


class ReconciliationService:
    """Schedules passes off the request path, one at a time in the deployment:

    - every ``reconciliation.interval``, all sites, by the process holding the schedule
      lease (``LEASE_NAME``);
    - every ``probe_interval``, the sites whose last pass failed (unreachable, timed out
      or erring: a site coming back is reconciled then);
    - on demand (``trigger``), in whichever process is asked.

    Every pass holds the pass lease (``PASS_LEASE_NAME``) while it runs; a pass asked for
    while one runs, here or in another process, does not start.
    """

    LEASE_NAME = "site-reconciliation"

    def __init__(self, settings: Settings, engine: sa.Engine, *, owner: str) -> None:
        self.settings = settings
        self.reconciler = Reconciler(settings, engine)
        self._engine = engine
        self._running = threading.Lock()
        provider = provider_for(engine)
        seconds = settings.reconciliation.lease_seconds
        self._lease = provider.make_lease(engine, self.LEASE_NAME, owner, seconds)
        self._pass_lease = provider.make_lease(engine, PASS_LEASE_NAME, owner, seconds)
        self.last_results: list[SitePassResult] = []
        config = settings.reconciliation
        self._full_every = config.interval.total_seconds()
        self._last_full: float | None = None  # time.monotonic() of the last full pass
        self._periodic = PeriodicTask(
            "reconciliation",
            self._tick,
            interval=min(config.interval, config.probe_interval).total_seconds(),
            lease=self._lease,
            first_delay=config.first_pass_delay.total_seconds(),
        )

    @property
    def running(self) -> bool:
        return self._running.locked()

    def site(self, site_id: str) -> ConfiguredSite | None:
        return next((site for site in self.settings.sites if site.id == site_id), None)

    def trigger(self, sites: Sequence[ConfiguredSite] | None = None) -> PassStart:
        """Start a pass of ``sites`` (all by default) in a thread, unless one runs here
        or in another process; says which. Blocks while it takes the pass lease (a
        database round trip); store errors propagate."""
        start = self._begin()
        if start is PassStart.STARTED:
            thread = threading.Thread(
                target=self._pass_and_release, args=(sites,), name="reconciliation", daemon=True
            )
            thread.start()
        return start

    def run_pass_now(self, sites: Sequence[ConfiguredSite] | None = None) -> list[SitePassResult]:
        """Run a pass in this thread and wait for it (``None`` sites: all); an empty list
        when a pass runs already, here or in another process."""
        if self._begin() is not PassStart.STARTED:
            return []
        return self._pass_and_release(sites)

    def _begin(self) -> PassStart:
        """Take this process's single-flight lock, then the pass lease."""
        if not self._running.acquire(blocking=False):
            return PassStart.RUNNING_HERE
        try:
            held = self._pass_lease.hold()
        except BaseException:
            self._running.release()
            raise
        if not held:
            self._running.release()
            return PassStart.RUNNING_ELSEWHERE
        return PassStart.STARTED

    def _pass_and_release(self, sites: Sequence[ConfiguredSite] | None) -> list[SitePassResult]:
        """The pass ``_begin`` started; gives back the lease, then the lock."""
        try:
            self.last_results = self.reconciler.run_pass(sites)
            return self.last_results
        except Exception:
            log.exception("a reconciliation pass failed")
            return []
        finally:
            try:
                self._pass_lease.release()
            except Exception:
                log.warning("could not release the reconciliation pass lease", exc_info=True)
            finally:
                self._running.release()

    def failed_sites(self) -> list[ConfiguredSite]:
        """The configured sites whose last pass failed (the site or central's store)."""
        with self._engine.connect() as conn:
            failed = set(
                conn.execute(sa.select(sr.site_id).where(sr.last_error.is_not(None))).scalars()
            )
        return [site for site in self.settings.sites if site.id in failed]

    async def run(self) -> None:
        """The schedule, until cancelled (``runtime.periodic``: a failed tick is logged and
        the schedule goes on; a running pass is waited for before the lease is released).
        ``serve`` runs it only when sites are configured."""
        await self._periodic.run()

    def _tick(self) -> None:
        """A full pass when ``reconciliation.interval`` has passed since the last one,
        else a pass of the sites whose last pass failed; nothing while another pass runs
        (here or elsewhere: the full pass is then tried at the next tick)."""
        if not self.settings.sites:
            return
        now = time.monotonic()
        full = self._last_full is None or now - self._last_full >= self._full_every
        sites = None if full else self.failed_sites()
        if sites == [] or self._begin() is not PassStart.STARTED:
            return
        if full:
            self._last_full = now
        self._pass_and_release(sites)
