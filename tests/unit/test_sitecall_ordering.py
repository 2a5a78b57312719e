"""The site-call ordering rules (pure) and the upsert's SQL per provider, compile only;
the live tests are tests/sitecalls/."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from controlroom.db.providers import provider_for
from controlroom.sitecalls.upsert import upsert_statement
from controlroom.telemetry.ordering import fold_states, ordering_key, supersedes
from controlroom.telemetry.stamps import Stamp

T = Stamp.of(datetime(2026, 12, 1, tzinfo=UTC))


def later(by: timedelta) -> Stamp:
    return Stamp.of(T.instant + by)


@dataclass(frozen=True)
class S:
    status: str
    updated_at_utc: Stamp = T
    epoch: int = 0


@pytest.mark.parametrize(
    ("incoming", "stored", "wins"),
    [
        (S("Delivered", later(timedelta(1))), S("Failed"), False),  # equal terminal rank
        (S("Discarded"), S("Parked"), True),
        (S("Forwarded", later(timedelta(1))), S("Attempted"), False),  # lower rank
        (S("Attempted"), S("Attempted"), False),  # equal stamps
        (S("Attempted", T.next()), S("Attempted"), True),  # 100 ns newer
        (S("Attempted"), S("Attempted", T.next()), False),  # 100 ns older
        (S("Skipped", later(timedelta(seconds=1))), S("Attempted"), True),  # newer, same rank
        (S("Submitted", epoch=1), S("Parked"), True),  # a new epoch
        (S("Delivered", later(timedelta(1))), S("Submitted", epoch=1), False),  # a stale epoch
    ],
)
def test_supersedes(incoming: S, stored: S, wins: bool) -> None:
    assert supersedes(incoming, stored) is wins


def test_ordering_key_and_fold() -> None:
    assert ordering_key(S("Skipped", epoch=2)) == (2, 2, T)
    states = [S("Forwarded"), S("Failed"), S("Delivered", later(timedelta(1))), S("Attempted")]
    assert fold_states(states).status == "Failed"  # the first terminal state stays
    with pytest.raises(ValueError):
        fold_states([])


@pytest.mark.parametrize("dialect", [postgresql.dialect(), sqlite.dialect()])
def test_the_upsert_is_one_guarded_on_conflict_statement(dialect: sa.Dialect) -> None:
    sql = str(upsert_statement(provider_for(dialect)).compile(dialect=dialect))
    assert "ON CONFLICT (tracked_operation_id) DO UPDATE SET" in sql
    guard = sql.split(" WHERE ", 1)[1]
    assert "excluded.epoch > site_calls.epoch" in guard
    assert (
        "(excluded.updated_at_utc, excluded.updated_at_tick) > "
        "(site_calls.updated_at_utc, site_calls.updated_at_tick)"
    ) in guard
    assert "RETURNING" in sql and "tracked_operation_id" in sql.rsplit("RETURNING", 1)[1]
