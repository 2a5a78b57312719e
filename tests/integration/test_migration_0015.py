"""Migration 0015 on each provider: deltas of a key longer than a btree index row, which
no fold could take under 0014 on PostgreSQL, are folded once it has run; a downgrade
keeps every count and gives 0014's unique index back."""

from __future__ import annotations

import random

import pytest
import sqlalchemy as sa
from alembic import command

from controlroom.db.migrate import alembic_config, upgrade_database
from controlroom.db.providers import provider_for
from controlroom.db.tables import failed_message_tally_deltas
from controlroom.errors import tallies
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from tests.factories import at, attempt
from tests.integration.older_schema import group_copies_before_0020
from tests.integration.test_long_tally_keys import long_key_headers
from tests.integration.test_tallies import NOW, full_aggregate, tallied


def deltas(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        count = sa.select(sa.func.count()).select_from(failed_message_tally_deltas)
        return conn.execute(count).scalar_one()


def tally_indexes(engine: sa.Engine) -> set[str]:
    """Names of the tallies' indexes (the inspector skips SQLite's expression indexes)."""
    postgresql = "SELECT indexname FROM pg_indexes WHERE tablename = 'failed_message_tallies'"
    sqlite = "SELECT name FROM sqlite_master WHERE tbl_name = 'failed_message_tallies'"
    with engine.connect() as conn:
        query = postgresql if conn.dialect.name == "postgresql" else sqlite
        return set(conn.exec_driver_sql(query).scalars())


def test_0015_folds_what_0014_could_not_and_a_downgrade_keeps_the_counts(
    engine: sa.Engine,
) -> None:
    writer = FailedMessageBatchWriter(engine, clock=lambda: NOW)
    config = alembic_config(engine)
    postgresql = provider_for(engine).keeps_tally_deltas
    command.downgrade(config, "0014")
    long = parse_failed_message(
        long_key_headers(0, random.Random(15)), b"{}", max_body_size_to_store=1024
    )
    with group_copies_before_0020():
        writer.write(IngestionBatch(attempts=[attempt(1, at(0)), long]))
    if postgresql:  # the defect: 0012's unique index cannot hold the long key
        with pytest.raises(sa.exc.OperationalError, match="index row size"):
            tallies.fold_deltas(engine)
        assert deltas(engine) > 0
    with engine.connect() as conn:
        before = full_aggregate(conn)
        assert tallied(conn) == before

    upgrade_database(engine)
    assert tallies.fold_deltas(engine)
    assert deltas(engine) == 0
    with engine.connect() as conn:
        assert tallied(conn) == full_aggregate(conn) == before

    command.downgrade(config, "0014")
    assert "ux_failed_message_tallies_key" in tally_indexes(engine)
    with engine.connect() as conn:
        assert tallied(conn) == before
    upgrade_database(engine)
    expected = (
        "ix_failed_message_tallies_key_digest" if postgresql else "ux_failed_message_tallies_key"
    )
    assert expected in tally_indexes(engine)
    assert tallies.fold_deltas(engine)
    with engine.connect() as conn:
        assert tallied(conn) == full_aggregate(conn) == before
