"""The site's tracking store: a local SQLite file, the source of truth of its cached calls.

Three tables: ``tracked_operations`` (one row per cached call: its state, the operation and
payload to attempt it again after a restart, when it is due, and which process has it in
hand), ``telemetry_outbox`` (packets not yet delivered to central) and
``site_notifications`` (the site's notifications: ``Pending`` until central took them,
then ``Forwarded``, or ``Rejected`` with central's reason, kept whole; both purged
after ``notification_retention_days``). Every transition
writes the row and its packet in one ``BEGIN IMMEDIATE`` transaction, so a packet exists
exactly when its transition committed, and stamps taken inside that transaction
(``lifecycle.next_stamp``) strictly increase in commit order.

Stamps are kept to 100 ns (``telemetry.stamps``): each is ``<name>_utc`` and
``<name>_tick``, as at central, and the pull contract orders by both.

The schema is created on open (``PRAGMA user_version`` says which; a store of schema 1,
whose stamps were microseconds, gains the tick columns, 0; schema 3 adds
``site_notifications``, which opening creates; schema 4 adds its ``recipients``); one
agent process owns a
store at a time (``TrackingStore.open`` takes an exclusive lock on a file beside it).
"""

from __future__ import annotations

import enum
import fcntl
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import sqlalchemy as sa

from controlroom.db.engine import create_store_engine
from controlroom.db.transactions import begin_write
from controlroom.db.types import UtcDateTime
from controlroom.exceptions import ConfigurationError
from controlroom.runtime.file_locks import held_elsewhere
from controlroom.site.lifecycle import DUE_STATUSES, CallState, Status, Transition, next_stamp
from controlroom.telemetry.stamps import Stamp, stamp_of, stamp_values
from controlroom.telemetry.widths import (
    CHANNEL_WIDTH,
    LAST_ERROR_WIDTH,
    NODE_WIDTH,
    SITE_WIDTH,
    STATUS_WIDTH,
    SUBJECT_WIDTH,
    TARGET_WIDTH,
    UUID_LEN,
)

SCHEMA_VERSION = 4
STAMPS = ("created_at", "updated_at", "terminal_at")
"""The stamps of a call's state, each ``{name}_utc`` and ``{name}_tick`` (schema 2)."""

metadata = sa.MetaData()

# A call's state in the telemetry contract's widths (central's ``site_calls`` has the same),
# then what only the site keeps.
tracked_operations = sa.Table(
    "tracked_operations",
    metadata,
    sa.Column("tracked_operation_id", sa.String(UUID_LEN), primary_key=True),
    sa.Column("channel", sa.String(CHANNEL_WIDTH), nullable=False),
    sa.Column("target", sa.String(TARGET_WIDTH), nullable=False),
    sa.Column("source_site", sa.String(SITE_WIDTH), nullable=False),
    sa.Column("source_node", sa.String(NODE_WIDTH)),
    sa.Column("status", sa.String(STATUS_WIDTH), nullable=False),
    sa.Column("retry_count", sa.Integer, nullable=False),
    sa.Column("last_error", sa.String(LAST_ERROR_WIDTH)),
    sa.Column("http_status", sa.Integer),
    sa.Column("created_at_utc", UtcDateTime, nullable=False),
    sa.Column("updated_at_utc", UtcDateTime, nullable=False),
    sa.Column("terminal_at_utc", UtcDateTime),
    sa.Column("epoch", sa.Integer, nullable=False),
    sa.Column("operation", sa.String(200), nullable=False),
    sa.Column("payload_json", sa.Text, nullable=False),
    sa.Column("next_attempt_at_utc", UtcDateTime),
    sa.Column("claimed_by", sa.String(UUID_LEN), comment="agent instance attempting it now"),
    *(
        sa.Column(f"{name}_tick", sa.SmallInteger, nullable=False, server_default="0")
        for name in STAMPS
    ),
    # The pull contract's order, and the retry loop's scan of due calls.
    sa.Index(
        "ix_tracked_operations_changes",
        "updated_at_utc",
        "updated_at_tick",
        "tracked_operation_id",
    ),
    sa.Index("ix_tracked_operations_due", "status", "next_attempt_at_utc"),
)

telemetry_outbox = sa.Table(
    "telemetry_outbox",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("packet_json", sa.Text, nullable=False),
    sqlite_autoincrement=True,
)

site_notifications = sa.Table(
    "site_notifications",
    metadata,
    sa.Column("notification_id", sa.String(UUID_LEN), primary_key=True),
    sa.Column("channel", sa.String(CHANNEL_WIDTH), nullable=False),
    sa.Column("target", sa.String(TARGET_WIDTH), nullable=False),
    sa.Column("subject", sa.String(SUBJECT_WIDTH), nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("severity", sa.String(STATUS_WIDTH), nullable=False),
    sa.Column("status", sa.String(STATUS_WIDTH), nullable=False),
    sa.Column("created_at_utc", UtcDateTime, nullable=False),
    sa.Column("updated_at_utc", UtcDateTime, nullable=False),
    sa.Column("rejected_reason", sa.Text, comment="central's reason, whole"),
    sa.Column("recipients", sa.Text, comment="JSON list of explicit addresses (schema 4)"),
    # The forwarder's scan of pending notifications, oldest first.
    sa.Index("ix_site_notifications_status", "status", "created_at_utc"),
)


class NotificationStatus(enum.StrEnum):
    """Where a site's notification stands: not yet taken by central, taken, or refused
    by central for good (kept with its reason, not sent again)."""

    PENDING = "Pending"
    FORWARDED = "Forwarded"
    REJECTED = "Rejected"


to = tracked_operations.c
sn = site_notifications.c
# The columns of a call's state, in the order of ``CallState`` (the tracking store's row).
STATE_COLUMNS = (
    "tracked_operation_id",
    "channel",
    "target",
    "source_site",
    "source_node",
    "status",
    "retry_count",
    "last_error",
    "http_status",
    "created_at_utc",
    "updated_at_utc",
    "terminal_at_utc",
    "epoch",
)


@dataclass(frozen=True, slots=True)
class DueCall:
    """A call the engine should attempt: its state and how to make it."""

    state: CallState
    operation: str
    payload: Any


def state_from_row(row: sa.Row[*tuple[Any, ...]]) -> CallState:
    """The call state a ``tracked_operations`` row holds."""
    values = {name: getattr(row, name) for name in STATE_COLUMNS}
    values["status"] = Status(values["status"])
    for name in STAMPS:
        values[f"{name}_utc"] = stamp_of(row, name)
    return CallState(**values)


def _state_values(state: CallState) -> dict[str, Any]:
    values = {name: getattr(state, name) for name in STATE_COLUMNS}
    values["status"] = str(state.status)
    for name in STAMPS:
        values.update(stamp_values(name, getattr(state, f"{name}_utc")))
    return values


def _upgrade_from_1(conn: sa.Connection) -> None:
    """Schema 1 -> 2: the stamps' 100 ns columns (0: schema 1 kept microseconds) and the
    pull order's index over them."""
    for name in STAMPS:
        conn.exec_driver_sql(
            f"ALTER TABLE tracked_operations ADD COLUMN {name}_tick SMALLINT NOT NULL DEFAULT 0"
        )
    conn.exec_driver_sql("DROP INDEX ix_tracked_operations_changes")
    (changes,) = [
        i for i in tracked_operations.indexes if i.name == "ix_tracked_operations_changes"
    ]
    changes.create(conn)


def _lock_path(path: Path) -> Path:
    """The file beside the store at ``path`` whose exclusive lock its agent holds."""
    return path.with_name(path.name + ".lock")


def in_use(path: Path) -> bool:
    """Whether another process has the store at ``path`` open (holds its lock), asked
    without waiting and without creating anything: a store never opened is not in use."""
    return held_elsewhere(_lock_path(path))


class TrackingStore:
    """The tracking store at ``path``; see the module doc. Blocking (SQLite) calls."""

    def __init__(self, engine: sa.Engine, lock: TextIO) -> None:
        self.engine = engine
        self._lock = lock

    @classmethod
    def open(cls, path: Path) -> TrackingStore:
        """Open (creating when absent) the store at ``path``.

        Raises ``ConfigurationError`` when its directory or lock file cannot be made
        there, when another process has it open, or when it was written by a newer
        schema.
        """
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(_lock_path(path), "w")  # noqa: SIM115 - held until close
        except OSError as exc:
            raise ConfigurationError(
                f"the tracking store {path} cannot be made there ({exc.strerror}): name "
                "another store_path (CONTROLROOM_SITE_STORE_PATH)"
            ) from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise ConfigurationError(
                f"the tracking store {path} is in use by another site agent process"
            ) from None
        engine = create_store_engine(f"sqlite:///{path.resolve()}", pool_size=2)
        with begin_write(engine) as conn:
            version = conn.exec_driver_sql("PRAGMA user_version").scalar_one()
            if version > SCHEMA_VERSION:
                engine.dispose()
                lock.close()
                raise ConfigurationError(
                    f"the tracking store {path} has schema {version}; this agent knows "
                    f"{SCHEMA_VERSION}: upgrade controlroom"
                )
            if version == 1:
                _upgrade_from_1(conn)
            if version == 3:
                conn.exec_driver_sql("ALTER TABLE site_notifications ADD COLUMN recipients TEXT")
            metadata.create_all(conn)
            conn.exec_driver_sql(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return cls(engine, lock)

    def close(self) -> None:
        self.engine.dispose()
        self._lock.close()

    # --- transitions ------------------------------------------------------------------
    @contextmanager
    def transition(self, now: datetime) -> Iterator[tuple[sa.Connection, Stamp]]:
        """A write transaction and the stamp its transition takes (module doc)."""
        with begin_write(self.engine) as conn:
            newest = conn.execute(
                sa.select(to.updated_at_utc, to.updated_at_tick)
                .order_by(to.updated_at_utc.desc(), to.updated_at_tick.desc())
                .limit(1)
            ).first()
            latest = None if newest is None else stamp_of(newest, "updated_at")
            yield conn, next_stamp(now, latest)

    def record(
        self,
        conn: sa.Connection,
        transition: Transition,
        packet: dict[str, Any],
        **extra: Any,
    ) -> None:
        """Write ``transition`` (insert or update its row) and queue ``packet``, in
        ``conn``'s transaction; ``extra`` sets the other columns (operation, payload,
        claim)."""
        values = {
            **_state_values(transition.state),
            "next_attempt_at_utc": transition.next_attempt_at_utc,
            **extra,
        }
        updated = conn.execute(
            sa.update(tracked_operations)
            .where(to.tracked_operation_id == transition.state.tracked_operation_id)
            .values(values)
        ).rowcount
        if not updated:
            conn.execute(sa.insert(tracked_operations).values(values))
        conn.execute(
            sa.insert(telemetry_outbox).values(packet_json=json.dumps(packet, sort_keys=True))
        )

    def read(
        self, conn: sa.Connection, tracked_operation_id: str
    ) -> sa.Row[*tuple[Any, ...]] | None:
        return conn.execute(
            sa.select(tracked_operations).where(to.tracked_operation_id == tracked_operation_id)
        ).first()

    # --- reads --------------------------------------------------------------------------
    def state(self, tracked_operation_id: str) -> CallState | None:
        """The stored state of one call; ``None`` when the store has no such call."""
        with self.engine.connect() as conn:
            row = self.read(conn, tracked_operation_id)
        return None if row is None else state_from_row(row)

    def states(self) -> list[CallState]:
        """Every tracked call's state (for tests and tooling; not paged)."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(tracked_operations)).all()
        return [state_from_row(row) for row in rows]

    def changes(
        self, since: Stamp | None, after_id: str | None, limit: int
    ) -> tuple[list[CallState], bool]:
        """The pull contract (``lifecycle.changes_after`` is its reference): up to
        ``limit`` rows ordered by ``(updated_at_utc, tracked_operation_id)`` strictly after
        ``(since, after_id)``, or at or after ``since`` without ``after_id``, and whether
        more follow; stamps to 100 ns."""
        query = sa.select(tracked_operations).order_by(
            to.updated_at_utc, to.updated_at_tick, to.tracked_operation_id
        )
        stamp = sa.tuple_(to.updated_at_utc, to.updated_at_tick)
        if since is not None:
            at = sa.tuple_(sa.literal(since.instant, UtcDateTime), since.tick)
            if after_id is None:
                query = query.where(stamp >= at)
            else:
                query = query.where(
                    sa.tuple_(to.updated_at_utc, to.updated_at_tick, to.tracked_operation_id)
                    > sa.tuple_(sa.literal(since.instant, UtcDateTime), since.tick, after_id)
                )
        with self.engine.connect() as conn:
            rows = conn.execute(query.limit(limit + 1)).all()
        return [state_from_row(row) for row in rows[:limit]], len(rows) > limit

    def due(self, now: datetime, limit: int) -> list[DueCall]:
        """Calls the engine should attempt now, oldest due first, not in anyone's hands."""
        query = (
            sa.select(tracked_operations)
            .where(
                to.status.in_([str(s) for s in DUE_STATUSES]),
                to.next_attempt_at_utc <= now,
                to.claimed_by.is_(None),
            )
            .order_by(to.next_attempt_at_utc)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [DueCall(state_from_row(r), r.operation, json.loads(r.payload_json)) for r in rows]

    def next_due_at(self) -> datetime | None:
        """When the earliest unclaimed call falls due; ``None`` when none waits."""
        query = sa.select(sa.func.min(to.next_attempt_at_utc)).where(
            to.status.in_([str(s) for s in DUE_STATUSES]), to.claimed_by.is_(None)
        )
        with self.engine.connect() as conn:
            due: datetime | None = conn.execute(query).scalar_one()
            return due

    # --- claims -------------------------------------------------------------------------
    def claim(self, state: CallState, owner: str) -> bool:
        """Take ``state``'s call in hand for an attempt by ``owner``; False when it moved
        on or someone else has it."""
        with begin_write(self.engine) as conn:
            return bool(
                conn.execute(
                    sa.update(tracked_operations)
                    .where(
                        to.tracked_operation_id == state.tracked_operation_id,
                        to.epoch == state.epoch,
                        to.status == str(state.status),
                        to.claimed_by.is_(None),
                    )
                    .values(claimed_by=owner)
                ).rowcount
            )

    def release_claims_of_others(self, owner: str) -> int:
        """Free the calls a previous process had in hand when it stopped (it cannot be
        running: the store is locked to one process); they are attempted again."""
        with begin_write(self.engine) as conn:
            return conn.execute(
                sa.update(tracked_operations)
                .where(to.claimed_by.is_not(None), to.claimed_by != owner)
                .values(claimed_by=None)
            ).rowcount

    # --- outbox -------------------------------------------------------------------------
    def pending_packets(self, limit: int) -> list[tuple[int, dict[str, Any]]]:
        """Up to ``limit`` undelivered packets, oldest first, with their sequence numbers."""
        query = sa.select(telemetry_outbox).order_by(telemetry_outbox.c.seq).limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [(row.seq, json.loads(row.packet_json)) for row in rows]

    def forget_packets(self, seqs: Sequence[int]) -> None:
        """Drop delivered packets."""
        with begin_write(self.engine) as conn:
            conn.execute(sa.delete(telemetry_outbox).where(telemetry_outbox.c.seq.in_(seqs)))

    def outbox_size(self) -> int:
        with self.engine.connect() as conn:
            return conn.execute(
                sa.select(sa.func.count()).select_from(telemetry_outbox)
            ).scalar_one()

    # --- notifications ----------------------------------------------------------------
    def add_notification(self, item: dict[str, Any], now: datetime) -> NotificationStatus:
        """Store ``item`` (``telemetry.notification.forwarded_item``'s fields but
        ``source_site``) as ``Pending``, committed before this returns; idempotent on its
        ``notification_id``. Returns the status of the stored row (a repeated id keeps
        the first row and its status)."""
        values = {name: item[name] for name in _NOTIFICATION_FIELDS}
        addresses = item.get("recipients")
        values["recipients"] = None if addresses is None else json.dumps(addresses)
        with begin_write(self.engine) as conn:
            status = conn.execute(
                sa.select(sn.status).where(sn.notification_id == values["notification_id"])
            ).scalar_one_or_none()
            if status is not None:
                return NotificationStatus(status)
            conn.execute(
                sa.insert(site_notifications).values(
                    **values,
                    status=str(NotificationStatus.PENDING),
                    created_at_utc=now,
                    updated_at_utc=now,
                )
            )
        return NotificationStatus.PENDING

    def pending_notifications(self, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` notifications central has not taken, oldest first."""
        query = (
            sa.select(*(sn[name] for name in _NOTIFICATION_FIELDS), sn.recipients)
            .where(sn.status == str(NotificationStatus.PENDING))
            .order_by(sn.created_at_utc, sn.notification_id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [_notification_of(row) for row in conn.execute(query)]

    def settle_notifications(
        self, forwarded: Sequence[str], rejected: Mapping[str, str], now: datetime
    ) -> None:
        """Mark ``forwarded`` ids ``Forwarded`` and ``rejected`` ones (id -> central's
        reason) ``Rejected``, in one transaction; only rows still ``Pending`` change."""
        pending = sn.status == str(NotificationStatus.PENDING)
        with begin_write(self.engine) as conn:
            if forwarded:
                conn.execute(
                    sa.update(site_notifications)
                    .where(sn.notification_id.in_(forwarded), pending)
                    .values(status=str(NotificationStatus.FORWARDED), updated_at_utc=now)
                )
            for notification_id, reason in rejected.items():
                conn.execute(
                    sa.update(site_notifications)
                    .where(sn.notification_id == notification_id, pending)
                    .values(
                        status=str(NotificationStatus.REJECTED),
                        rejected_reason=reason,
                        updated_at_utc=now,
                    )
                )

    def purge_notifications(self, older_than: datetime, *, batch: int = 1000) -> int:
        """Delete the notifications central settled (``Forwarded``, ``Rejected``) before
        ``older_than`` (their ``updated_at_utc``: when central answered), ``batch`` per
        transaction so the agent's other writers wait little; ``Pending`` ones are
        never deleted. Returns how many went."""
        settled = [str(NotificationStatus.FORWARDED), str(NotificationStatus.REJECTED)]
        purged = 0
        while True:
            chosen = (
                sa.select(sn.notification_id)
                .where(sn.status.in_(settled), sn.updated_at_utc < older_than)
                .limit(batch)
            )
            with begin_write(self.engine) as conn:
                gone = conn.execute(
                    sa.delete(site_notifications).where(
                        sn.notification_id.in_(chosen.scalar_subquery())
                    )
                ).rowcount
            purged += gone
            if gone < batch:
                return purged

    def notifications(self, status: NotificationStatus | None, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` notifications, newest first, of ``status`` (any when ``None``),
        each with its status, reason and stamps."""
        query = sa.select(site_notifications).order_by(
            sn.created_at_utc.desc(), sn.notification_id.desc()
        )
        if status is not None:
            query = query.where(sn.status == str(status))
        with self.engine.connect() as conn:
            return [_notification_of(row) for row in conn.execute(query.limit(limit))]

    def notification(self, notification_id: str) -> dict[str, Any] | None:
        """One notification as ``notifications`` gives it; ``None`` when absent."""
        query = sa.select(site_notifications).where(sn.notification_id == notification_id)
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else _notification_of(row)


def _notification_of(row: sa.Row[*tuple[Any, ...]]) -> dict[str, Any]:
    """A ``site_notifications`` row as a dict, its ``recipients`` a list (or ``None``)."""
    values = dict(row._mapping)
    if values["recipients"] is not None:
        values["recipients"] = json.loads(values["recipients"])
    return values


_NOTIFICATION_FIELDS = ("notification_id", "channel", "target", "subject", "body", "severity")
