"""docs/decisions.md "No committed row points at a missing body", whatever the order of
an ingestion of a new attempt and the retention sweep of the message's old row."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa

from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.pipeline import IngestionUnitOfWork
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.retention import RetentionSweeper
from tests.factories import at
from tests.nsb import failed_headers

PERIOD = timedelta(days=15)


class SweepAfterPut(FileSystemBodyStore):
    """A body store that runs a sweep right after the next ``put`` lands: the sweep falls
    between the new attempt's body write and the commit of the row that points at it."""

    sweeper: RetentionSweeper | None = None

    def put(self, key: str, data: bytes) -> None:
        super().put(key, data)
        sweeper, self.sweeper = self.sweeper, None
        if sweeper is not None:
            result = sweeper.sweep_once()
            assert result is not None and result.deleted == 1


def attempt_of(body: bytes, seconds: int):  # type: ignore[no-untyped-def]
    return parse_failed_message(
        failed_headers("order-7", failed_at=at(seconds), content_type="application/octet-stream"),
        body,
        max_body_size_to_store=102_400,
    )


def test_a_sweep_between_the_body_write_and_the_commit_leaves_the_new_body(
    engine: sa.Engine, tmp_path: Path
) -> None:
    bodies = SweepAfterPut(tmp_path / "bodies")
    writer = FailedMessageBatchWriter(engine, body_store=bodies)
    old = attempt_of(b"\x00old", 0)
    bodies.put(old.body_key, old.body)  # type: ignore[arg-type]
    writer.write(IngestionBatch(attempts=[old]))
    with engine.begin() as conn:  # archived long ago: the sweep will take it
        conn.execute(
            sa.update(failed_messages).values(
                status=int(FailedMessageStatus.ARCHIVED), status_changed_at=at(0) - 2 * PERIOD
            )
        )
    for body in (b"\x00old", b"\x00new"):  # the same bytes (the same key) and new bytes
        bodies.sweeper = RetentionSweeper(
            engine, bodies, retention_period=PERIOD, clock=lambda: at(0)
        )
        again = attempt_of(body, 60 if body == b"\x00old" else 120)

        async def ingest() -> None:
            unit = IngestionUnitOfWork(writer, bodies)
            unit.record_failed_processing_attempt(again)  # noqa: B023
            await unit.complete()

        asyncio.run(ingest())

        assert bodies.sweeper is None, "the sweep ran"
        with engine.connect() as conn:
            row = conn.execute(sa.select(failed_messages)).one()
        assert row.status == FailedMessageStatus.UNRESOLVED
        assert row.body_key == again.body_key
        assert bodies.get(row.body_key) == body
        with engine.begin() as conn:  # archived again, for the next round
            conn.execute(
                sa.update(failed_messages).values(
                    status=int(FailedMessageStatus.ARCHIVED),
                    status_changed_at=at(0) - 2 * PERIOD,
                )
            )
