"""The embedded durable intake queue: one SQLite file, shared by every local process.

The default transport when no broker URL is set (docs/design.md "Process shape": ``controlroom
serve`` with no configuration runs on an embedded durable intake queue). A ``controlroom
demo`` process may publish while ``controlroom serve`` consumes: every claim, ack and
publish is a SQLite transaction on the same file (WAL mode, busy timeout), so processes
coordinate through the file's write lock, not through memory.

Leases: a consumer claims up to ``prefetch`` ready messages atomically (one ``UPDATE ...
RETURNING`` inside ``BEGIN IMMEDIATE``), which stamps them with this transport's owner id
and an expiry ``lease_seconds`` ahead. While the transport is alive it renews the leases
of every delivery it holds, so a live consumer never loses a message however long its
commit takes. Each transport also holds a lock (``flock``) on a record of its owner id
beside the file (``<file>.consumers/``) while it is open: a transport that opens the file
gives back at once the claims of every owner whose record no process holds (a process
killed or crashed; docs/decisions.md "The embedded queue gives back an ended consumer's
claims when it is next opened"), and a process alive but stuck stops renewing, its
messages ready again when the lease expires. ``ack`` deletes, ``reject(requeue=True)``
releases (the message keeps its FIFO position), ``reject(requeue=False)`` deletes.
Settling checks the lease owner, so a consumer whose lease expired cannot delete a
message another consumer now holds.

Durability: ``publish`` commits with ``synchronous=FULL`` (survives power loss); claims,
acks and releases use ``NORMAL`` (survive a process crash; after a power loss an ack may
be undone, which only means a redelivery). Times are Unix seconds from the wall clock of
the one machine that shares the file.

All SQLite work runs on one dedicated thread per transport: a sqlite3 connection belongs
to one thread, and a busy wait on the file lock must not occupy the event loop or the
shared default executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import sqlite3
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple, TypeVar

from controlroom.runtime import file_locks
from controlroom.runtime.file_locks import hold
from controlroom.transport.base import (
    UNREADABLE_HEADER,
    AckMany,
    Delivery,
    DeliveryLostError,
    QueueDepth,
    TransportClosedError,
    TransportError,
    check_max_bytes,
    check_prefetch,
    check_queue_name,
    fill_message_id,
    resolve_message_id,
    validate_headers,
    validate_typed_headers,
)
from controlroom.transport.properties import (
    MessageProperties,
    header_strings,
    message_properties,
    parse_properties,
    properties_json,
    structured_kinds,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

UNREADABLE_STORED = "Controlroom.EmbeddedQueue.StoredHeaders"
"""Beside ``UNREADABLE_HEADER``: a row's stored headers text that is no JSON object, kept
as it was."""
UNREADABLE_PROPERTIES = "Controlroom.EmbeddedQueue.StoredProperties"
"""Beside ``UNREADABLE_HEADER``: a row's stored broker properties that could not be read,
kept as they were."""


class _BodyMissing(Exception):
    """A claimed row whose body row is gone (written outside the transport)."""


DEFAULT_LEASE_SECONDS = 300.0
DEFAULT_POLL_INTERVAL_SECONDS = 0.1
BUSY_TIMEOUT_SECONDS = 30.0
SCHEMA_VERSION = 3

# lease_expires_at is 0 for a ready message, so "ready" is one comparison for both never
# claimed and expired leases. Bodies live in a table of their own (version 2): a claim, a
# renewal or a release rewrites a message's row, and SQLite rewrites a row whole, so a
# body in it was read into memory and written to the WAL again by each of them.
# ``size``: length(body) + length(headers_json), what a claim's byte limit adds up.
_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS queue_messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        queue TEXT NOT NULL,
        headers_json TEXT NOT NULL,
        message_id TEXT,
        content_type TEXT,
        enqueued_at REAL NOT NULL,
        delivery_count INTEGER NOT NULL DEFAULT 0,
        lease_owner TEXT,
        lease_expires_at REAL NOT NULL DEFAULT 0,
        size INTEGER NOT NULL DEFAULT 0,
        properties_json TEXT
    )
    """,
    "CREATE TABLE IF NOT EXISTS queue_bodies (id INTEGER PRIMARY KEY, body BLOB NOT NULL)",
    """
    CREATE TRIGGER IF NOT EXISTS queue_messages_delete_body AFTER DELETE ON queue_messages
    BEGIN DELETE FROM queue_bodies WHERE id = old.id; END
    """,
    "CREATE INDEX IF NOT EXISTS ix_queue_messages_queue_id ON queue_messages (queue, id)",
    """
    CREATE INDEX IF NOT EXISTS ix_queue_messages_lease_owner
    ON queue_messages (lease_owner) WHERE lease_owner IS NOT NULL
    """,
)
# A version 1 file (bodies in queue_messages) is moved to version 2 when it is opened.
_FROM_VERSION_1 = (
    "CREATE TABLE queue_bodies (id INTEGER PRIMARY KEY, body BLOB NOT NULL)",
    "INSERT INTO queue_bodies (id, body) SELECT id, body FROM queue_messages",
    "ALTER TABLE queue_messages ADD COLUMN size INTEGER NOT NULL DEFAULT 0",
    "UPDATE queue_messages SET size = length(body) + length(headers_json)",
    "ALTER TABLE queue_messages DROP COLUMN body",
)
# Version 3 keeps a message's further broker properties (``MessageProperties``), NULL when
# it has none.
_FROM_VERSION_2 = ("ALTER TABLE queue_messages ADD COLUMN properties_json TEXT",)
# AUTOINCREMENT: ids are never reused, so FIFO order is id order and a stale settle by id
# can never hit a newer message.

_INSERT = """
    INSERT INTO queue_messages
        (queue, headers_json, message_id, content_type, enqueued_at, size, properties_json)
    VALUES (?, ?, ?, ?, ?, ?, ?)
"""
_INSERT_BODY = "INSERT INTO queue_bodies (id, body) VALUES (?, ?)"
_HAS_READY = "SELECT 1 FROM queue_messages WHERE queue = ? AND lease_expires_at <= ? LIMIT 1"
_CLAIM = """
    UPDATE queue_messages
    SET lease_owner = ?, lease_expires_at = ?, delivery_count = delivery_count + 1
    WHERE id IN (
        SELECT id FROM queue_messages
        WHERE queue = ? AND lease_expires_at <= ?
        ORDER BY id
        LIMIT ?
    )
    RETURNING id, headers_json, message_id, properties_json
"""
# The oldest ready messages while their stored sizes add up to at most the byte limit
# (a running sum over id order), the first one regardless when the consumer holds nothing.
_CLAIM_BYTES = """
    UPDATE queue_messages
    SET lease_owner = ?, lease_expires_at = ?, delivery_count = delivery_count + 1
    WHERE id IN (
        SELECT id FROM (
            SELECT id,
                   ROW_NUMBER() OVER (ORDER BY id) AS position,
                   SUM(size) OVER (ORDER BY id) AS running
            FROM queue_messages
            WHERE queue = ? AND lease_expires_at <= ?
            ORDER BY id
            LIMIT ?
        )
        WHERE running <= ? OR (position = 1 AND ?)
    )
    RETURNING id, headers_json, message_id, properties_json
"""
_HELD = "SELECT 1 FROM queue_messages WHERE id = ? AND lease_owner = ?"
_DELETE_LEASED = "DELETE FROM queue_messages WHERE id = ? AND lease_owner = ?"
_DELETE_MANY_LEASED = """
    DELETE FROM queue_messages
    WHERE lease_owner = ? AND id IN (SELECT value FROM json_each(?))
    RETURNING id
"""
_RELEASE_LEASED = """
    UPDATE queue_messages SET lease_owner = NULL, lease_expires_at = 0
    WHERE id = ? AND lease_owner = ?
"""
_RELEASE_ALL = """
    UPDATE queue_messages SET lease_owner = NULL, lease_expires_at = 0
    WHERE lease_owner = ?
"""
_RENEW = "UPDATE queue_messages SET lease_expires_at = ? WHERE id = ? AND lease_owner = ?"
_DEPTH = """
    SELECT count(*), min(enqueued_at) FROM queue_messages
    WHERE queue = ? AND lease_expires_at <= ?
"""
_PURGE = "DELETE FROM queue_messages WHERE queue = ? AND lease_expires_at <= ?"


class _Row(NamedTuple):
    """A claimed message without its body, which is read when it is yielded."""

    id: int
    headers_json: str
    message_id: str | None
    properties_json: str | None


@dataclass(eq=False)
class _Session:
    """One ``consume()`` call: its queue, its unsettled claims, its wake-up signal."""

    queue: str
    prefetch: int
    max_bytes: int | None = None
    in_flight: set[int] = field(default_factory=set)  # claimed, not yet settled
    yielded: dict[Delivery, int] = field(default_factory=dict)  # unsettled -> row id
    held_bytes: int = 0  # Delivery.size of the yielded, unsettled ones
    consuming: bool = True
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    ack_many: AckMany | None = None  # one hook per session: a batch's deliveries share it


class EmbeddedQueue:
    """Durable FIFO queues in the SQLite file ``path`` (created with its directory).

    ``lease_seconds`` (> 0): how long a claimed message stays invisible to other
    consumers without renewal, i.e. how soon a crashed consumer's messages come back.
    ``poll_interval_seconds`` (> 0): how often an idle consumer looks for messages
    published by other processes (same-process publishes wake it at once).
    ``owner``: the id its claims carry (default a new UUID); whoever knows it may give
    them back at once when this transport's process dies (``release_claims``).
    Queue names are data: they are SQL parameters, never SQL text or file names.
    """

    def __init__(
        self,
        path: Path,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_SECONDS,
        owner: str | None = None,
    ) -> None:
        if lease_seconds <= 0 or poll_interval_seconds <= 0:
            raise ValueError("lease_seconds and poll_interval_seconds must be positive")
        self._path = Path(path)
        self._lease_seconds = float(lease_seconds)
        self._poll_interval = float(poll_interval_seconds)
        self._owner = owner or f"{uuid.uuid4()}"
        self._conn: sqlite3.Connection | None = None
        self._record: IO[str] | None = None  # the owner's record, locked while open
        self._executor: ThreadPoolExecutor | None = None
        self._renewal: asyncio.Task[None] | None = None
        self._sessions: set[_Session] = set()
        self._started = False
        self._closed = False

    def __repr__(self) -> str:
        return f"EmbeddedQueue({str(self._path)!r})"

    @property
    def destination(self) -> str:
        """The queue's file, as its absolute path with links and ``..`` resolved
        (``Transport.destination``)."""
        return f"embedded queue {self._path.resolve()}"

    async def __aenter__(self) -> EmbeddedQueue:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Open (creating if needed) the queue file. Idempotent.

        Raises ``TransportError`` when the file cannot be opened or initialised,
        ``TransportClosedError`` after ``close()``.
        """
        if self._closed:
            raise TransportClosedError(f"{self!r} is closed")
        if self._started:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="controlroom-queue")
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._open_sync)
        except (sqlite3.Error, OSError) as exc:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise TransportError(f"cannot open the embedded queue {self._path}: {exc}") from exc
        self._started = True
        self._renewal = asyncio.create_task(self._renew_forever(), name="controlroom-queue-lease")

    async def close(self) -> None:
        """Stop consumers, give every unsettled message back to its queue, close the
        file. Idempotent; later settles raise ``DeliveryLostError``."""
        if self._closed:
            return
        self._closed = True
        for session in self._sessions:
            session.wakeup.set()
        if not self._started:
            return
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewal
        assert self._executor is not None
        try:
            # Jobs run in submission order on the one thread, so this runs after any
            # claim already submitted: nothing claimed before close stays leased.
            await asyncio.get_running_loop().run_in_executor(self._executor, self._close_sync)
        finally:
            self._executor.shutdown(wait=False)

    async def check(self) -> None:
        """Return when the queue file answers a query; raise ``TransportError`` if not."""
        try:
            await self._run(lambda conn: conn.execute("SELECT 1").fetchall())
        except TransportClosedError:
            raise
        except TransportError as exc:
            raise TransportError(f"embedded queue {self._path} is unhealthy: {exc}") from exc

    # -- producer side ---------------------------------------------------------------

    async def publish(
        self,
        queue: str,
        headers: Mapping[str, str | None],
        body: bytes,
        *,
        message_id: str | None = None,
        content_type: str | None = None,
        properties: MessageProperties | None = None,
    ) -> None:
        """Append a message to ``queue``; returns after the commit reached the disk.

        Headers keep ``None`` values. ``properties`` are kept as they are (a consumer
        gets them back on ``Delivery.properties``); consumers see their typed headers
        as strings, as on RabbitMQ. Raises ``ValueError`` for a bad name, header or
        body type; ``TransportError`` when SQLite fails (the insert was rolled back).
        """
        check_queue_name(queue)
        if not isinstance(body, bytes | bytearray | memoryview):
            raise ValueError(f"body must be bytes, not {type(body).__name__}")
        # ensure_ascii (the default) keeps the stored JSON plain ASCII; it round-trips
        # every str exactly.
        valid = validate_headers(headers)
        message_id = resolve_message_id(valid, message_id)
        stored_properties = None
        if properties is not None:
            typed = {**valid, **validate_typed_headers(properties.headers or {})}
            valid = header_strings(typed)
            stored_properties = _properties_json(properties, typed)
        headers_json = json.dumps(valid, separators=(",", ":"))
        data = bytes(body)
        size = len(data) + len(headers_json)
        params = (
            queue,
            headers_json,
            message_id,
            content_type,
            time.time(),
            size,
            stored_properties,
        )

        def insert(conn: sqlite3.Connection) -> None:
            with _write_transaction(conn, durable=True):
                row_id = conn.execute(_INSERT, params).lastrowid
                conn.execute(_INSERT_BODY, (row_id, data))

        await self._run(insert)
        self._wake(queue)

    async def purge(self, queue: str) -> int:
        """Delete the ready messages of ``queue`` (in-flight ones stay); returns the
        count."""
        check_queue_name(queue)
        return await self._run(
            lambda conn: _execute_in_write(conn, _PURGE, (queue, time.time())).rowcount
        )

    async def queue_depth(self, queue: str) -> QueueDepth:
        """The ready messages of ``queue`` (not leased) and the age of the oldest of them
        in seconds (0 when none is ready)."""
        check_queue_name(queue)

        def read(conn: sqlite3.Connection) -> QueueDepth:
            now = time.time()
            ready, oldest = conn.execute(_DEPTH, (queue, now)).fetchone()
            age = 0.0 if oldest is None else max(0.0, now - oldest)
            return QueueDepth(messages=int(ready), oldest_age_seconds=age)

        return await self._run(read)

    # -- consumer side ---------------------------------------------------------------

    async def consume(
        self, queue: str, prefetch: int, *, max_bytes: int | None = None
    ) -> AsyncGenerator[Delivery, None]:
        """Yield deliveries of ``queue`` in FIFO order, at most ``prefetch`` unsettled
        and, with ``max_bytes``, at most that many bytes of them (``Delivery.size``; a
        message alone may be larger). A claim never takes more than fits: the stored
        size it measures (body plus headers JSON) is never less than ``Delivery.size``.

        Runs until ``close()`` or until the iterator is closed or cancelled; claimed
        messages not yet yielded are then released, yielded ones stay settleable (and
        their leases renewed) until settled or ``close()``. See ``Transport.consume``.
        """
        check_queue_name(queue)
        check_prefetch(prefetch)
        check_max_bytes(max_bytes)
        self._require_open()
        session = _Session(queue, prefetch, max_bytes)
        session.ack_many = functools.partial(self._ack_many, session)
        self._sessions.add(session)
        claimed: deque[_Row] = deque()
        try:
            while not self._closed:
                if not claimed:
                    claimed.extend(await self._claim_for(session))
                    continue
                # The body is read as its message is yielded, never a claim's bodies at
                # once (docs/decisions.md "What ingestion holds is bounded by bytes").
                row = claimed[0]
                unreadable: list[str] = []
                try:
                    body = await self._run(functools.partial(self._read_body_sync, row.id))
                except _BodyMissing:
                    body, unreadable = b"", ["its body is missing"]
                claimed.popleft()
                if body is None:  # no longer ours (its lease lapsed): another consumer's
                    session.in_flight.discard(row.id)
                    continue
                yield self._delivery(session, row, body, unreadable)
        finally:
            session.consuming = False
            await self._release_unyielded(session, [row.id for row in claimed])
            self._forget_if_idle(session)

    async def _claim_for(self, session: _Session) -> list[_Row]:
        """Claim what the session has room for; waits (and returns []) when there is
        no room or nothing ready."""
        room = session.prefetch - len(session.in_flight)
        room_bytes = None if session.max_bytes is None else session.max_bytes - session.held_bytes
        session.wakeup.clear()  # before the claim, so a publish during it is not missed
        if room <= 0 or (room_bytes is not None and room_bytes <= 0):
            await session.wakeup.wait()  # a settle or close sets it
            return []
        rows = await self._claim(session.queue, room, room_bytes, alone=not session.in_flight)
        if self._closed:
            return []  # close() released them already (it ran after the claim)
        if not rows:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval):
                    await session.wakeup.wait()
            return []
        session.in_flight.update(row.id for row in rows)
        return rows

    async def _claim(
        self, queue: str, limit: int, limit_bytes: int | None, *, alone: bool
    ) -> list[_Row]:
        """Lease up to ``limit`` ready messages, oldest first, of at most ``limit_bytes``
        in all (``None``: no byte limit) except that one message is always taken when
        ``alone`` (the consumer holds nothing).

        The claim runs on the queue thread even if this task is cancelled; the rows
        it claimed are then released rather than left leased until expiry.
        """
        loop = asyncio.get_running_loop()
        self._require_open()
        claim = functools.partial(self._claim_sync, queue, limit, limit_bytes, alone=alone)
        future = loop.run_in_executor(self._executor, claim)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(self._release_abandoned_claim)
            raise
        except sqlite3.Error as exc:
            raise TransportError(f"embedded queue {self._path}: {exc}") from exc

    def _release_abandoned_claim(self, future: asyncio.Future[list[_Row]]) -> None:
        if future.cancelled() or future.exception() is not None or self._closed:
            return
        ids = [row.id for row in future.result()]
        if ids and self._executor is not None:
            self._executor.submit(self._release_sync, ids)

    def _delivery(
        self, session: _Session, row: _Row, body: bytes, unreadable: list[str]
    ) -> Delivery:
        """``row`` as a delivery of ``body``. What cannot be read of a row written outside
        the transport (headers that are no JSON object, broker properties) is kept as
        stored in a header of its own, and the delivery says why in
        ``UNREADABLE_HEADER`` (with ``unreadable``'s reasons): a failed import, never a
        consumer's crash."""
        headers, structured = _stored_headers(_as_text(row.headers_json), unreadable)
        headers = fill_message_id(headers, row.message_id)
        properties = None
        if row.properties_json is not None:
            stored_properties = _as_text(row.properties_json)
            try:
                properties = message_properties(parse_properties(stored_properties))
            except (ValueError, TypeError, RecursionError) as exc:
                unreadable.append(f"its broker properties are no JSON object of them ({exc})")
                headers[UNREADABLE_PROPERTIES] = stored_properties
        if unreadable:
            headers[UNREADABLE_HEADER] = "; ".join(unreadable)

        async def reject(requeue: bool) -> None:
            await self._settle(session, delivery, _RELEASE_LEASED if requeue else _DELETE_LEASED)
            if requeue:
                self._wake(session.queue)

        delivery = Delivery(
            headers=headers,
            body=body,
            queue=session.queue,
            on_ack=lambda: self._settle(session, delivery, _DELETE_LEASED),
            on_reject=reject,
            on_ack_many=session.ack_many,
            properties=properties,
            structured=structured,
        )
        session.yielded[delivery] = row.id
        session.held_bytes += delivery.size
        return delivery

    async def _settle(self, session: _Session, delivery: Delivery, sql: str) -> None:
        """Delete or release one leased message, only while this transport holds it."""
        message_id = session.yielded[delivery]
        if self._closed:
            self._settled(session, [delivery])
            raise DeliveryLostError("the embedded queue was closed; the message went back")
        params = (message_id, self._owner)
        changed = await self._run(lambda conn: _execute_in_write(conn, sql, params).rowcount)
        self._settled(session, [delivery])
        if changed != 1:
            raise DeliveryLostError(
                "the lease on this message expired and another consumer may hold it"
            )

    async def _ack_many(self, session: _Session, deliveries: Sequence[Delivery]) -> None:
        """Delete the leased messages of ``deliveries`` in one transaction (docs/decisions.md
        "A batch is acknowledged at once"); the ones whose lease this transport lost stay for their
        new holder."""
        ids = [session.yielded[delivery] for delivery in deliveries]
        if self._closed:
            self._settled(session, deliveries)
            raise DeliveryLostError("the embedded queue was closed; the messages went back")
        deleted = await self._run(lambda conn: self._delete_many_sync(ids))
        self._settled(session, deliveries)
        if deleted != len(ids):
            raise DeliveryLostError(
                f"the lease on {len(ids) - deleted} of {len(ids)} messages expired and another "
                "consumer may hold them"
            )

    def _settled(self, session: _Session, deliveries: Sequence[Delivery]) -> None:
        """Whatever the outcome, the leases of ``deliveries`` are no longer ours to renew
        and their bytes no longer held."""
        for delivery in deliveries:
            session.in_flight.discard(session.yielded.pop(delivery))
            session.held_bytes -= delivery.size
        session.wakeup.set()
        self._forget_if_idle(session)

    async def _release_unyielded(self, session: _Session, ids: list[int]) -> None:
        """Give back claims the consumer never saw (best effort: unreleased ones are
        no longer renewed, so they come back at lease expiry anyway)."""
        session.in_flight.difference_update(ids)
        if not ids or self._closed:
            return
        try:
            # Shielded: a cancelled consumer still gets its claims released.
            await asyncio.shield(self._run(lambda _conn: self._release_sync(ids)))
        except TransportError:
            log.warning(
                "could not release %d unyielded messages; they return at lease expiry",
                len(ids),
                exc_info=True,
            )

    def _forget_if_idle(self, session: _Session) -> None:
        if not session.consuming and not session.in_flight:
            self._sessions.discard(session)

    def _wake(self, queue: str) -> None:
        for session in self._sessions:
            if session.queue == queue:
                session.wakeup.set()

    # -- lease renewal ---------------------------------------------------------------

    async def _renew_forever(self) -> None:
        """Every third of the lease, push the expiry of every held message forward.

        A failed renewal is logged and retried next round (two more chances before
        the lease lapses).
        """
        while True:
            await asyncio.sleep(self._lease_seconds / 3)
            ids = [message_id for s in self._sessions for message_id in s.in_flight]
            if not ids:
                continue
            try:
                await self._run(lambda _conn: self._renew_sync(ids))  # noqa: B023 - awaited here
            except TransportError:
                log.warning("renewing %d embedded-queue leases failed", len(ids), exc_info=True)

    # -- the queue thread ------------------------------------------------------------

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work(connection)`` on the queue thread.

        Raises ``TransportClosedError`` when not open, ``TransportError`` (wrapping the
        ``sqlite3.Error``) when SQLite fails; the work's transaction was rolled back.
        """
        self._require_open()
        conn = self._conn
        assert conn is not None
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, work, conn)
        except sqlite3.Error as exc:
            raise TransportError(f"embedded queue {self._path}: {exc}") from exc

    def _require_open(self) -> None:
        if self._closed:
            raise TransportClosedError(f"{self!r} is closed")
        if not self._started or self._executor is None:
            raise TransportClosedError(f"{self!r} is not started; call start() first")

    def _open_sync(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN IMMEDIATE / COMMIT ourselves.
        conn = sqlite3.connect(self._path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
        # Text written outside the transport may be no UTF-8: read it with its bytes kept
        # (lone surrogates), so its row is delivered as a failed import, not a claim that
        # fails for ever (``_stored_headers``).
        conn.text_factory = _text_as_written
        try:
            conn.execute("PRAGMA journal_mode=WAL").fetchall()
            conn.execute("PRAGMA synchronous=NORMAL")
            with _write_transaction(conn):
                version = conn.execute("PRAGMA user_version").fetchall()[0][0]
                if version == 1:
                    for statement in _FROM_VERSION_1:
                        conn.execute(statement)
                if version in (1, 2):
                    for statement in _FROM_VERSION_2:
                        conn.execute(statement)
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION:d}")
            records = _records_of(self._path)
            self._record = _hold_record(records, self._owner)
            _release_ended_owners(conn, records)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _claim_sync(
        self, queue: str, limit: int, limit_bytes: int | None, *, alone: bool
    ) -> list[_Row]:
        conn = self._conn
        assert conn is not None
        now = time.time()
        # A plain read first: an idle consumer polls often and must not take the file's
        # write lock (and stall other processes' publishes) each time.
        # fetchall, not fetchone: an unfinished SELECT would keep its read snapshot open
        # into the write transaction below.
        if not conn.execute(_HAS_READY, (queue, now)).fetchall():
            return []
        with _write_transaction(conn):
            now = time.time()
            params: tuple[Any, ...] = (self._owner, now + self._lease_seconds, queue, now, limit)
            if limit_bytes is None:
                rows = [_Row(*r) for r in conn.execute(_CLAIM, params).fetchall()]
            else:
                params += (limit_bytes, alone)
                rows = [_Row(*r) for r in conn.execute(_CLAIM_BYTES, params).fetchall()]
        rows.sort(key=lambda row: row.id)  # RETURNING order is unspecified
        return rows

    def _read_body_sync(self, row_id: int, conn: sqlite3.Connection) -> bytes | None:
        """The body of claimed row ``row_id``, or ``None`` when this queue no longer holds
        its lease. Read through SQLite's incremental blob I/O straight into one ``bytes``
        (a plain ``SELECT`` of a large blob makes SQLite assemble a copy of its own first).
        Raises ``_BodyMissing`` when its body row is gone."""
        with _read_transaction(conn):
            held = conn.execute(_HELD, (row_id, self._owner)).fetchall()
            if not held:
                return None
            try:
                blob = conn.blobopen("queue_bodies", "body", row_id, readonly=True)
            except sqlite3.OperationalError as exc:  # "no such rowid"
                raise _BodyMissing(row_id) from exc
            with blob:
                return blob.read()

    def _release_sync(self, ids: Sequence[int]) -> None:
        conn = self._conn
        assert conn is not None
        with _write_transaction(conn):
            conn.executemany(_RELEASE_LEASED, [(i, self._owner) for i in ids])

    def _delete_many_sync(self, ids: Sequence[int]) -> int:
        conn = self._conn
        assert conn is not None
        with _write_transaction(conn):
            params = (self._owner, json.dumps(list(ids)))
            return len(conn.execute(_DELETE_MANY_LEASED, params).fetchall())

    def _renew_sync(self, ids: Sequence[int]) -> None:
        conn = self._conn
        assert conn is not None
        with _write_transaction(conn):
            until = time.time() + self._lease_seconds
            conn.executemany(_RENEW, [(until, i, self._owner) for i in ids])

    def _close_sync(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            _execute_in_write(conn, _RELEASE_ALL, (self._owner,))
        except sqlite3.Error:
            log.warning(
                "could not release leases on close; they return when the queue is next "
                "opened, or at expiry",
                exc_info=True,
            )
        else:
            _drop_record(self._path, self._owner)  # nothing left to give back
        finally:
            conn.close()
            if self._record is not None:
                self._record.close()  # the lock goes with it
                self._record = None


def _properties_json(properties: MessageProperties, typed: Mapping[str, Any]) -> str:
    return properties_json(
        {
            "content_encoding": properties.content_encoding,
            "correlation_id": properties.correlation_id,
            "reply_to": properties.reply_to,
            "priority": properties.priority,
            "headers": typed or None,
        }
    )


@contextlib.contextmanager
def _write_transaction(conn: sqlite3.Connection, *, durable: bool = False) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``: take the write lock up front.

    A deferred transaction that reads then writes can fail with SQLITE_BUSY_SNAPSHOT,
    which the busy timeout does not retry; IMMEDIATE waits for the lock instead.
    ``durable`` commits with ``synchronous=FULL`` (fsync of the WAL).
    """
    if durable:
        conn.execute("PRAGMA synchronous=FULL")
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        if durable:
            conn.execute("PRAGMA synchronous=NORMAL")


@contextlib.contextmanager
def _read_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN`` ... ``COMMIT`` of reads: one snapshot for the statements inside."""
    conn.execute("BEGIN")
    try:
        yield
    finally:
        conn.execute("COMMIT")


def release_claims(path: Path, owner: str) -> int:
    """Give back every message that the transport with ``owner`` id holds in the queue
    file at ``path``, in their FIFO positions; returns how many. For a process that
    knows the owner has died (serve, of its killed intake worker): its claims come back
    now instead of at lease expiry. Blocking. Raises ``sqlite3.Error`` when the file
    cannot be written."""
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
    try:
        return _execute_in_write(conn, _RELEASE_ALL, (owner,)).rowcount
    finally:
        conn.close()


def _records_of(path: Path) -> Path:
    """The directory of the owners' records of the queue file at ``path``."""
    return path.with_name(f"{path.name}.consumers")


def _record_name(owner: str) -> str:
    # The owner id is ours, but a file name is made from no text as it is.
    return hashlib.sha256(owner.encode()).hexdigest()[:32]


def _hold_record(records: Path, owner: str) -> IO[str]:
    """Write ``owner``'s record in ``records`` and hold its lock; returns the open file.
    Locked before it takes its name, so no other process sees it unheld."""
    records.mkdir(exist_ok=True)
    name = _record_name(owner)
    handle = (records / f".{name}.new").open("w", encoding="utf-8")
    try:
        hold(handle)
        handle.write(owner)
        handle.flush()
        os.replace(records / f".{name}.new", records / name)
    except BaseException:
        handle.close()
        raise
    return handle


def _release_ended_owners(conn: sqlite3.Connection, records: Path) -> None:
    """Give back the claims of every owner whose record in ``records`` no process holds,
    and remove the record; a record half made (``.*.new``) by an ended process too. Nothing
    where files cannot be locked: no record would be held, a live owner's neither."""
    if not file_locks.LOCKS:
        return
    for record in sorted(records.iterdir()):
        if file_locks.held_elsewhere(record):
            continue
        if not record.name.startswith("."):
            try:
                owner = record.read_text(encoding="utf-8")
            except FileNotFoundError:
                continue  # its transport closed meanwhile: it gave its claims back itself
            released = _execute_in_write(conn, _RELEASE_ALL, (owner,)).rowcount
            if released:
                log.info(
                    "gave back %d messages of the embedded queue that an ended consumer "
                    "held (its process ended without closing the queue)",
                    released,
                )
        record.unlink(missing_ok=True)


def _drop_record(path: Path, owner: str) -> None:
    """Remove ``owner``'s record, before its lock is let go."""
    with contextlib.suppress(OSError):
        (_records_of(path) / _record_name(owner)).unlink()


def _execute_in_write(
    conn: sqlite3.Connection, sql: str, params: Sequence[Any], *, durable: bool = False
) -> sqlite3.Cursor:
    with _write_transaction(conn, durable=durable):
        return conn.execute(sql, params)


def _text_as_written(data: bytes) -> str:
    """A text column as stored: UTF-8, any other byte kept as a lone surrogate."""
    return data.decode("utf-8", "surrogateescape")


def _as_text(stored: object) -> str:
    """A text column's value as text, however another tool stored it: a BLOB's bytes as
    ``_text_as_written`` reads text, a number as its digits."""
    if isinstance(stored, bytes):
        return _text_as_written(stored)
    return stored if isinstance(stored, str) else str(stored)


def _stored_headers(
    text: str, unreadable: list[str]
) -> tuple[dict[str, str | None], dict[str, str]]:
    """The headers stored as ``text`` and which of them hold a table or an array
    (``structured_kinds``): a JSON object, its values made text as AMQP's typed values
    are (``header_strings``); anything else (no JSON, nested deeper than the decoder
    goes) kept whole under ``UNREADABLE_STORED``, its reason added to ``unreadable``."""
    try:
        stored = json.loads(text)
    except (ValueError, RecursionError):
        stored = None
    if isinstance(stored, dict):
        return header_strings(stored), structured_kinds(stored)
    unreadable.append("its headers are no JSON object")
    return {UNREADABLE_STORED: text}, {}
