"""The tables a drain rewrites stay small on PostgreSQL: migration 0021's per-table
autovacuum settings are in place (``pg_class.reloptions``) and go with a downgrade, and a
fold of the group counts rewrites only the keys that changed since the last fold
(docs/decisions.md "The counter tables are vacuumed as they turn over")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command

from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.errors import tallies
from controlroom.errors.ingest import identity
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailureGroup
from tests.factories import at, attempt

EXPECTED = {
    "failed_message_group_counts": {
        "autovacuum_vacuum_scale_factor=0",
        "autovacuum_vacuum_threshold=200",
        "autovacuum_vacuum_cost_delay=0",
    },
    "failed_message_tally_deltas": {
        "autovacuum_vacuum_scale_factor=0",
        "autovacuum_vacuum_threshold=200",
        "autovacuum_vacuum_cost_delay=0",
    },
    "failed_message_tallies": {
        "autovacuum_vacuum_scale_factor=0",
        "autovacuum_vacuum_threshold=200",
        "autovacuum_vacuum_cost_delay=0",
        "fillfactor=50",
    },
    "failed_messages": {
        "autovacuum_vacuum_scale_factor=0.02",
        "autovacuum_vacuum_insert_scale_factor=0.02",
    },
    "failed_message_groups": {
        "autovacuum_vacuum_scale_factor=0.02",
        "autovacuum_vacuum_insert_scale_factor=0.02",
    },
}


@pytest.fixture
def store(postgresql_url: str) -> Iterator[sa.Engine]:
    engine = create_store_engine(postgresql_url)
    try:
        upgrade_database(engine)
        yield engine
    finally:
        engine.dispose()


def reloptions(engine: sa.Engine) -> dict[str, set[str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT relname, reloptions FROM pg_class WHERE relname = ANY(:tables)"),
            {"tables": list(EXPECTED)},
        ).all()
    return {name: set(options or ()) for name, options in rows}


def test_the_drained_tables_carry_their_autovacuum_settings_and_a_downgrade_resets_them(
    store: sa.Engine,
) -> None:
    assert reloptions(store) == EXPECTED

    command.downgrade(alembic_config(store), "0020")
    assert reloptions(store) == {table: set() for table in EXPECTED}

    upgrade_database(store)
    assert reloptions(store) == EXPECTED


def group(n: int) -> FailureGroup:
    return FailureGroup(
        id=identity.group_id("Kind", f"Kind {n}"), classifier="Kind", title=f"Kind {n}"
    )


def count_rows(engine: sa.Engine) -> dict[str, list[tuple[str, int]]]:
    """Per group id, its count rows as (ctid, n): where each row lives, and its count."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT group_id, ctid::text, n FROM failed_message_group_counts ORDER BY 1, 2")
        ).all()
    found: dict[str, list[tuple[str, int]]] = {}
    for group_id, ctid, n in rows:
        found.setdefault(group_id, []).append((ctid, n))
    return found


def test_a_fold_rewrites_the_group_counts_of_the_changed_keys_only(store: sa.Engine) -> None:
    writer = FailedMessageBatchWriter(store)
    quiet, busy = group(1), group(2)
    writer.write(IngestionBatch(attempts=[attempt(1, at(1), groups=(quiet,))]))
    writer.write(IngestionBatch(attempts=[attempt(2, at(2), groups=(busy,))]))
    tallies.fold_deltas(store)
    before = count_rows(store)

    writer.write(IngestionBatch(attempts=[attempt(3, at(3), groups=(busy,))]))
    tallies.fold_deltas(store)
    after = count_rows(store)

    assert after[quiet.id] == before[quiet.id]  # the same row, where it was: not rewritten
    assert [n for _, n in after[busy.id]] == [2]
    assert after[busy.id] != before[busy.id]
