"""Verify the audit log's hash chains and keep what each verification found.

Source: docs/design.md "Audit log". ``controlroom audit verify`` walks every month's
chain in order (``db.audit_chain.ChainWalk``) and stops at the first event where one
breaks; its result goes to ``audit_verifications``, which the console's audit log page
shows as a badge, with the chains' heads it saw: a later walk checks that each chain
still reaches its recorded head, which shows events removed from a month's end or a month
removed whole (before its retention), which the links alone cannot. Read-only on the log
itself: the service role can run it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from controlroom.db.audit_chain import Break, ChainWalk, Head, chain_month
from controlroom.db.tables import audit_log, audit_log_policy, audit_verifications
from controlroom.db.transactions import begin_write
from controlroom.runtime.clock import Clock, utc_now

al = audit_log.c
av = audit_verifications.c
ap = audit_log_policy.c
PROGRESS_EVERY = 1000
"""Events between two calls of a verification's ``progress``."""


@dataclass(frozen=True, slots=True)
class Verification:
    """What one walk of the chains found: events and month chains read (up to the break
    when there is one), the first break or ``None``, each chain's newest event (month ->
    place, hash), and when (aware UTC)."""

    verified_at: datetime
    events: int
    chains: int
    broken: Break | None
    heads: dict[int, Head]

    @property
    def intact(self) -> bool:
        return self.broken is None


def count_audit_events(engine: sa.Engine) -> int:
    """How many events the audit log holds (a progress bar's total)."""
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(audit_log)).scalar_one()


def verify_audit_log(
    engine: sa.Engine,
    *,
    progress: Callable[[int], None] | None = None,
    clock: Clock = utc_now,
) -> Verification:
    """Walk every chain in (``chain_month``, ``chain_seq``) order (the chain index),
    streaming, until the first break; each chain must still reach the head the last
    intact verification recorded, unless its month may have been purged (older than
    the floor of ``audit_log_policy``). ``progress(events_read)`` is called every
    ``PROGRESS_EVERY`` events."""
    now = clock()
    query = sa.select(audit_log).order_by(al.chain_month, al.chain_seq)
    with engine.connect() as conn:
        floor = conn.execute(sa.select(ap.min_retention_days).where(ap.id == 1)).scalar_one()
        walk = ChainWalk(
            _recorded_heads(conn), purgeable_before=chain_month(now - timedelta(days=floor))
        )
        broken = None
        rows = conn.execution_options(yield_per=PROGRESS_EVERY).execute(query).mappings()
        for row in rows:
            broken = walk.check(row)
            if broken is not None:
                break
            if progress is not None and walk.events % PROGRESS_EVERY == 0:
                progress(walk.events)
        rows.close()
    if broken is None:
        broken = walk.finish()
    return Verification(now, walk.events, walk.chains, broken, walk.heads)


def _recorded_heads(conn: sa.Connection) -> dict[int, Head]:
    """The chains' heads the latest intact verification saw (none before the first)."""
    recorded = conn.execute(
        sa.select(av.heads_json)
        .where(av.intact, av.heads_json.is_not(None))
        .order_by(av.verified_at_utc.desc(), av.id.desc())
        .limit(1)
    ).scalar_one_or_none()
    if recorded is None:
        return {}
    return {int(month): (seq, digest) for month, (seq, digest) in json.loads(recorded).items()}


def record_verification(engine: sa.Engine, verification: Verification) -> None:
    """Keep ``verification`` in ``audit_verifications`` (the latest is the console's)."""
    broken = verification.broken
    with begin_write(engine) as conn:
        conn.execute(
            sa.insert(audit_verifications).values(
                verified_at_utc=verification.verified_at,
                intact=verification.intact,
                events=verification.events,
                chains=verification.chains,
                broken_event_id=broken.event_id if broken else None,
                reason=describe_break(broken) if broken else None,
                heads_json=json.dumps(verification.heads) if verification.intact else None,
            )
        )


def describe_break(broken: Break) -> str:
    """One line naming where the chain breaks and why."""
    if broken.event_id is None:
        return broken.reason
    place = f"month {broken.chain_month}, place {broken.chain_seq}"
    return f"event {broken.event_id} ({place}): {broken.reason}"


def last_verification(conn: sa.Connection) -> sa.Row[Any] | None:
    """The latest row of ``audit_verifications``, ``None`` before the first."""
    return conn.execute(
        sa.select(audit_verifications).order_by(av.verified_at_utc.desc(), av.id.desc()).limit(1)
    ).one_or_none()
