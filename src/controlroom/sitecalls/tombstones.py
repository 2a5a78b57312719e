"""Tombstones of purged site calls: a late packet must not bring a purged call back.

Source: docs/design.md "Site call retention". The retention purge deletes a terminal call
and, in the same transaction, keeps its id and terminal stamp in
``site_call_tombstones`` (``write_tombstones``). While the tombstone is kept, a packet or
a reconciliation row of that id is rejected into ``rejected_telemetry`` with
``tombstone_reason`` (``SiteCallWriter``), so a replay of an old packet does not
re-create the call as a pending row that the KPIs would show stuck for ever. A tombstone
is kept ``sitecalls.tombstone_days`` after the purge that wrote it (``expire_tombstones``),
so at least ``sitecalls.retention_days`` + ``tombstone_days`` after the call ended, however
late the purge ran; after that a packet of the id is taken again, as a new call.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

import sqlalchemy as sa

from controlroom.db.providers import Provider, chunked
from controlroom.db.tables import site_call_tombstones, site_calls
from controlroom.db.transactions import begin_write
from controlroom.telemetry.stamps import Stamp, stamp_of

st = site_call_tombstones.c


def write_tombstones(
    conn: sa.Connection, provider: Provider, purged: Sequence[sa.RowMapping], now: datetime
) -> None:
    """Keep a tombstone of each purged call in ``purged`` (rows with
    ``tracked_operation_id``, ``terminal_at_utc``, ``terminal_at_tick``), purged at
    ``now``, in ``conn``'s transaction, the purge's; a tombstone already kept stays."""
    provider.insert_rows_if_absent(
        conn,
        site_call_tombstones,
        [
            {
                "tracked_operation_id": row["tracked_operation_id"],
                "terminal_at_utc": row["terminal_at_utc"],
                "terminal_at_tick": row["terminal_at_tick"],
                "purged_at_utc": now,
            }
            for row in purged
        ],
    )


def tombstones_of(
    conn: sa.Connection, provider: Provider, ids: Collection[str]
) -> dict[str, Stamp]:
    """The terminal stamp of each of ``ids`` that has a tombstone; absent ids are not in
    the answer."""
    found: dict[str, Stamp] = {}
    for chunk in chunked(sorted(ids), provider.max_ids_per_in_list):
        query = sa.select(st.tracked_operation_id, st.terminal_at_utc, st.terminal_at_tick).where(
            st.tracked_operation_id.in_(chunk)
        )
        for row in conn.execute(query):
            stamp = stamp_of(row, "terminal_at")
            assert stamp is not None  # the column is NOT NULL
            found[row.tracked_operation_id] = stamp
    return found


def bury(conn: sa.Connection, ids: Collection[str]) -> None:
    """Delete the rows of tombstoned ``ids`` a packet has just written (at most
    ``max_ids_per_in_list``): a purged call never comes back as a live row."""
    if ids:
        conn.execute(sa.delete(site_calls).where(site_calls.c.tracked_operation_id.in_(ids)))


def tombstone_reason(terminal: Stamp) -> str:
    """Why a packet of a purged call (terminal at ``terminal``) is rejected: the field and
    the rule."""
    return (
        f"tracked_operation_id: the call ended at {terminal.isoformat()} and was purged by "
        "retention; packets of a purged call are refused for sitecalls.tombstone_days "
        "after the purge"
    )


def expire_tombstones(engine: sa.Engine, cutoff: datetime, *, chunk: int) -> int:
    """Delete the tombstones written by a purge before ``cutoff`` (UTC), in chunks of
    ``chunk`` rows, each its own transaction; returns how many."""
    expired = st.purged_at_utc < cutoff
    total = 0
    while True:
        with begin_write(engine) as conn:
            ids = (
                conn.execute(sa.select(st.tracked_operation_id).where(expired).limit(chunk))
                .scalars()
                .all()
            )
            if ids:
                conn.execute(
                    sa.delete(site_call_tombstones).where(st.tracked_operation_id.in_(ids), expired)
                )
        total += len(ids)
        if len(ids) < chunk:
            return total
