"""A read that would fold the tally deltas never waits for the connection pool.

``errors.tallies.fold_deltas_if_many`` folds on another connection of the reader's
engine; with every connection of the pool checked out, taking one waited the pool's
timeout (30 s) before the fold failed and the read went on. It now folds only when a
connection is free now, and leaves the deltas to a later fold otherwise. PostgreSQL
only: the other providers keep no deltas.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from controlroom.db.engine import create_store_engine
from controlroom.db.tables import failed_message_tally_deltas
from controlroom.errors import tallies
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from tests import servers
from tests.factories import at, attempt
from tests.integration.test_tallies import NOW


@pytest.fixture
def small_engine() -> Iterator[sa.Engine]:
    """A PostgreSQL store at head whose pool holds at most two connections (size 1,
    overflow 1) and waits 30 s (the default) for one."""
    url = servers.create_postgresql_database(migrated=True)
    engine = create_store_engine(url, pool_size=1)
    try:
        yield engine
    finally:
        engine.dispose()
        servers.drop_postgresql_database(url)


def deltas(conn: sa.Connection) -> int:
    count = sa.select(sa.func.count()).select_from(failed_message_tally_deltas)
    return conn.execute(count).scalar_one()


def test_a_read_does_not_wait_for_an_exhausted_pool_to_fold(
    small_engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tallies, "FOLD_AFTER_DELTAS", 1)
    writer = FailedMessageBatchWriter(small_engine, clock=lambda: NOW)
    for n in range(3):  # one delta row per statement: three batches, three rows
        writer.write(IngestionBatch(attempts=[attempt(n, at(n), endpoint=f"E{n}")]))
    with small_engine.connect() as reader:
        with small_engine.connect() as other:
            assert deltas(reader) == 3
            other.execute(sa.text("SELECT 1"))  # both connections checked out: none free
            started = time.monotonic()
            tallies.fold_deltas_if_many(reader)
            assert time.monotonic() - started < small_engine.pool.timeout() / 3
            reader.rollback()
            assert deltas(reader) == 3  # left for a later fold
        tallies.fold_deltas_if_many(reader)  # the other is back in the pool: free now
        reader.rollback()
        assert deltas(reader) == 0
