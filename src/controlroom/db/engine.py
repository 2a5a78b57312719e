"""Engines for every supported provider, write transactions replayed on transient
errors, and the retry policy of a whole batch (``retry_transient``).

The provider applies its own connection rules (``Provider.create_engine``); see
``controlroom.db.providers``.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import sqlalchemy as sa
import tenacity
from sqlalchemy.engine import make_url

from controlroom.db.errors import is_transient, name_driver_refusals
from controlroom.db.providers import Provider, provider_named
from controlroom.db.transactions import begin_write
from controlroom.exceptions import UnsupportedProviderError

T = TypeVar("T")
log = logging.getLogger(__name__)

__all__ = [
    "RunningStatements",
    "begin_write",
    "create_store_engine",
    "database_url_problem",
    "normalize_database_url",
    "retry_transient",
    "run_write_transaction",
    "store_identity",
]


def normalize_database_url(url: str | sa.URL) -> sa.URL:
    """Parse ``url``, choosing the provider's default driver when none is named.

    Raises ``sqlalchemy.exc.ArgumentError`` for text that is no URL,
    ``UnsupportedProviderError`` for a provider Controlroom does not support or a driver
    SQLAlchemy does not know.
    """
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    normalized = provider_named(backend).normalize_url(parsed)
    try:
        normalized.get_dialect()  # loads SQLAlchemy's dialect, not the driver itself
    except sa.exc.NoSuchModuleError:
        raise UnsupportedProviderError(
            f"SQLAlchemy knows no database driver {normalized.get_driver_name()!r} for "
            f"{backend}; give the URL as {backend}://... and Controlroom uses the driver it "
            "installs"
        ) from None
    return normalized


def database_url_problem(url: str) -> str | None:
    """What makes ``url`` unusable as the store's URL, found without connecting, in words
    for the operator that never quote it (it may hold a password): no URL, a provider or
    driver not served, a NUL in any part or white space at the edges of its user,
    database or host (decoded: ``%00``, ``%20``), or the provider's own finding
    (``Provider.url_problem``: e.g. a PostgreSQL URL naming no database). ``None`` when
    nothing is found."""
    if any(character.isspace() for character in url):  # "x " is another database than "x"
        return "it must be a URL without white space"
    # SQLAlchemy keeps a "#" in the name: "db#x", another database by mistake.
    if "#" in url:
        return "it holds a '#', which begins a URL's fragment: write %23 for one in a name"
    try:
        parsed = normalize_database_url(url)
    except sa.exc.ArgumentError:
        return (
            "it must be a database URL (sqlite:///path/to/file.db, "
            "postgresql://user@host:5432/database)"
        )
    except UnsupportedProviderError as exc:
        return str(exc)
    # Decoded (%00, %20): a driver cuts its connection string at a NUL, dropping the user
    # and password after it; a name's edge space names another database or user.
    named = {"user": parsed.username, "database": parsed.database, "host": parsed.host}
    options = [v for value in parsed.query.values() for v in _as_list(value)]
    password = [] if parsed.password is None else [str(parsed.password)]
    if any("\x00" in part for part in [*filter(None, named.values()), *password, *options]):
        return "no part of it may hold a NUL (%00)"
    for part, value in named.items():
        if value and value != value.strip():
            return f"its {part} begins or ends with white space (%20)"
    return provider_named(parsed.get_backend_name()).url_problem(parsed)


def _as_list(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else value


_SECRET_QUERY_KEYS = frozenset({"password", "sslpassword"})
"""libpq's connection keywords that hold a secret, which a URL's query may carry."""


def shown_url(url: str | sa.URL) -> str:
    """``url`` as logs, errors and answers show it: its password hidden, before the host
    or in the query (``?password=``, which SQLAlchemy passes on to the driver), as
    ``***``."""
    parsed = make_url(url) if isinstance(url, str) else url
    secrets = [key for key in parsed.query if key.lower() in _SECRET_QUERY_KEYS]
    rest = parsed.difference_update_query(secrets)
    shown = rest.render_as_string(hide_password=True)
    if not secrets:
        return shown
    return shown + ("&" if rest.query else "?") + "&".join(f"{key}=***" for key in secrets)


def store_identity(engine: sa.Engine) -> str:
    """One text for ``engine``'s database however its URL spells it, without credentials
    (``Provider.store_identity``). Raises what connecting raises."""
    with engine.connect() as conn:
        return provider_named(engine.dialect.name).store_identity(conn)


def create_store_engine(url: str | sa.URL, *, pool_size: int = 10) -> sa.Engine:
    """Create the engine for ``url`` with the provider's connection rules applied; the
    driver's encoding refusals raise ``UnstorableValue`` (``db.errors``).

    Raises ``UnsupportedProviderError`` for a provider Controlroom does not support or a
    driver it does not install.
    """
    parsed = normalize_database_url(url)
    backend = parsed.get_backend_name()
    try:
        engine = provider_named(backend).create_engine(parsed, pool_size=pool_size)
    except ModuleNotFoundError as exc:
        raise UnsupportedProviderError(
            f"database driver {parsed.get_driver_name()!r} is not installed; give the URL as "
            f"{backend}://... and Controlroom uses the driver it installs"
        ) from exc
    sa.event.listen(engine, "handle_error", name_driver_refusals)
    _track_running_statements(engine, provider_named(backend))
    return engine


class RunningStatements:
    """The store connections that one piece of work (an intake: its task and the tasks
    and threads it starts) holds, so that ``cancel`` can end their statements from
    another thread: an intake's stop cancels what its batches still wait on when the grace
    ends (docs/decisions.md "A stop finishes the batches in hand"). A connection is
    counted from its checkout out of an engine's pool inside ``tracked`` until its
    checkin; thread-safe."""

    def __init__(self, owner: str) -> None:
        self._owner = owner  # for the log: "the intake of 'error'"
        self._held: dict[int, tuple[Provider, Any]] = {}  # by id of its pool record
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def tracked(self) -> Iterator[None]:
        """Count the connections checked out in this context, and in the tasks and
        threads (``asyncio.to_thread``) it starts, which copy it."""
        token = _RUNNING.set(self)
        try:
            yield
        finally:
            _RUNNING.reset(token)

    def cancel_at_grace_end(self) -> int:
        """At the end of a stop's grace: cancel the statement each held connection runs
        (``Provider.cancel_statement``), say so when there was one, and return how many
        connections were held. A cancel that cannot be sent is logged."""
        with self._lock:
            held = list(self._held.values())
        for provider, dbapi_connection in held:
            try:
                provider.cancel_statement(dbapi_connection)
            except Exception as exc:
                log.warning("a statement of %s could not be cancelled: %s", self._owner, exc)
        if held:
            log.warning(
                "the stop's grace is over: sent a cancel to the %d statement%s of %s still "
                "under way (what its batches in hand wait on); each batch goes back to the "
                "queue once its statement ends (SQLite: a wait for the store's lock ends by "
                "its busy timeout)",
                len(held),
                "" if len(held) == 1 else "s",
                self._owner,
            )
        return len(held)

    def _checked_out(self, record: Any, provider: Provider, dbapi_connection: Any) -> None:
        with self._lock:
            self._held[id(record)] = (provider, dbapi_connection)

    def _checked_in(self, record: Any) -> None:
        with self._lock:
            self._held.pop(id(record), None)


_RUNNING: contextvars.ContextVar[RunningStatements | None] = contextvars.ContextVar(
    "running_statements", default=None
)
_RECORD_KEY = "controlroom.running_statements"


def _track_running_statements(engine: sa.Engine, provider: Provider) -> None:
    """Count each connection checked out of ``engine``'s pool inside a
    ``RunningStatements.tracked`` context with that context's counter."""

    def on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        running = _RUNNING.get()
        if running is not None:
            running._checked_out(record, provider, dbapi_connection)
            record.info[_RECORD_KEY] = running

    def on_checkin(_dbapi_connection: Any, record: Any) -> None:
        running = record.info.pop(_RECORD_KEY, None)
        if running is not None:
            running._checked_in(record)

    sa.event.listen(engine, "checkout", on_checkout)
    sa.event.listen(engine, "checkin", on_checkin)


def run_write_transaction(engine: sa.Engine, work: Callable[[sa.Connection], T]) -> T:
    """``work(conn)`` in a write transaction, replayed whole (up to 3 times, short waits)
    when the store reports a transient error such as a deadlock or a serialization
    failure (docs/design.md "Transient failures"). ``work`` must be safe to replay: it runs
    again from scratch on a fresh transaction. Other errors propagate at once.
    """
    for attempt in tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
        stop=tenacity.stop_after_attempt(3),
        reraise=True,
    ):
        with attempt, begin_write(engine) as conn:
            return work(conn)
    raise AssertionError("unreachable: tenacity either returns or reraises")


def retry_transient(
    *,
    max_backoff_seconds: float = 30.0,
    stop_event: threading.Event | None = None,
    on_failure: Callable[[BaseException], None] | None = None,
) -> tenacity.Retrying:
    """Retry policy for a whole batch: transient store errors only, capped back-off.

    Retries until ``stop_event`` is set (forever without one); docs/design.md "Transient
    failures": the batch is idempotent, so a replay after an ambiguous commit is harmless.
    Each failure replayed is logged (a warning), then passed to ``on_failure`` (an
    intake's health: a store refusing writes for long is degraded).
    """
    stop: tenacity.stop.stop_base = (
        tenacity.stop_when_event_set(stop_event) if stop_event else tenacity.stop_never
    )
    log_it = tenacity.before_sleep_log(log, logging.WARNING)
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        wait=tenacity.wait_exponential(multiplier=0.1, max=max_backoff_seconds),
        stop=stop,
        reraise=True,
        # Sleep on the event so that stopping interrupts a long back-off at once.
        # cast: tenacity ignores what sleep returns, but types it None (Event.wait: bool).
        sleep=cast(Callable[[float], None], stop_event.wait) if stop_event else time.sleep,
        before_sleep=log_it if on_failure is None else _told(log_it, on_failure),
    )


def _told(
    log_it: Callable[[tenacity.RetryCallState], None],
    on_failure: Callable[[BaseException], None],
) -> Callable[[tenacity.RetryCallState], None]:
    """A ``before_sleep`` that logs as ``log_it`` does, then passes the failure on."""

    def before_sleep(state: tenacity.RetryCallState) -> None:
        log_it(state)
        if state.outcome is not None and (exc := state.outcome.exception()) is not None:
            on_failure(exc)

    return before_sleep
