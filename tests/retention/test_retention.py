"""Retention of Resolved and Archived failed messages (docs/design.md "Retention"), per provider."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa

from controlroom.db.providers import provider_for
from controlroom.db.tables import (
    FailedMessageStatus,
    failed_message_group_comments,
    failed_message_groups,
    failed_messages,
)
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.retention import LEASE_NAME, RetentionSweeper
from controlroom.exceptions import BodyStoreError
from tests.factories import at
from tests.nsb import failed_headers

DAY = timedelta(days=1)
PERIOD = 15 * DAY
BIG_BINARY = b"\x00\x01" * 100


def store(
    engine: sa.Engine,
    body_store: FileSystemBodyStore,
    name: str,
    status: FailedMessageStatus,
    changed_days_ago: float,
) -> str:
    attempt = parse_failed_message(
        failed_headers(name, content_type="application/octet-stream"),
        BIG_BINARY,
        max_body_size_to_store=102_400,
    )
    assert attempt.body_key is not None
    body_store.put(attempt.body_key, attempt.body)
    FailedMessageBatchWriter(engine).write(IngestionBatch(attempts=[attempt]))
    with engine.begin() as conn:
        conn.execute(
            sa.update(failed_messages)
            .where(failed_messages.c.id == attempt.unique_message_id)
            .values(status=int(status), status_changed_at=at(0) - changed_days_ago * DAY)
        )
    return attempt.unique_message_id


def remaining(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.select(failed_messages.c.message_id)).scalars())


def test_sweep_deletes_old_resolved_and_archived_rows_with_their_bodies(
    engine: sa.Engine, tmp_path: Path
) -> None:
    bodies = FileSystemBodyStore(tmp_path / "bodies")
    old_resolved = store(engine, bodies, "old-resolved", FailedMessageStatus.RESOLVED, 20)
    store(engine, bodies, "old-archived", FailedMessageStatus.ARCHIVED, 16)
    store(engine, bodies, "young-resolved", FailedMessageStatus.RESOLVED, 14)
    store(engine, bodies, "old-unresolved", FailedMessageStatus.UNRESOLVED, 100)
    store(engine, bodies, "old-retry-issued", FailedMessageStatus.RETRY_ISSUED, 100)
    clock = [at(0)]
    sweeper = RetentionSweeper(engine, bodies, retention_period=PERIOD, clock=lambda: clock[0])

    result = sweeper.sweep_once()

    assert result is not None and result.deleted == 2
    assert remaining(engine) == {"young-resolved", "old-unresolved", "old-retry-issued"}
    assert not (tmp_path / "bodies" / old_resolved).exists()
    with engine.connect() as conn:
        grouped = set(conn.execute(sa.select(failed_message_groups.c.failed_message_id)).scalars())
    assert old_resolved not in grouped

    clock[0] = at(0) + 2 * DAY  # the cutoff moves with every run
    assert sweeper.sweep_once().deleted == 1  # type: ignore[union-attr]
    assert remaining(engine) == {"old-unresolved", "old-retry-issued"}


def test_only_the_lease_holder_sweeps_and_only_while_sweeping(
    engine: sa.Engine, tmp_path: Path
) -> None:
    bodies = FileSystemBodyStore(tmp_path / "bodies")
    store(engine, bodies, "old-resolved", FailedMessageStatus.RESOLVED, 20)
    other = provider_for(engine).make_lease(engine, LEASE_NAME, "another-process", 60)
    first = RetentionSweeper(engine, bodies, retention_period=PERIOD, clock=lambda: at(0))
    second = RetentionSweeper(engine, bodies, retention_period=PERIOD, clock=lambda: at(0))

    assert other.hold()
    try:
        assert first.sweep_once() is None  # another process is sweeping
        assert remaining(engine) == {"old-resolved"}
    finally:
        other.release()
    assert first.sweep_once() is not None
    assert second.sweep_once() is not None  # the first let go when it finished
    assert remaining(engine) == set()


class FailingDeletes(FileSystemBodyStore):
    """A body store whose deletions fail for the messages named in ``refuse``."""

    refuse: set[str]

    def delete_message(self, unique_message_id: str, *, keep: str | None = None) -> None:
        if unique_message_id in self.refuse:
            raise BodyStoreError(f"permission denied: {unique_message_id}")
        super().delete_message(unique_message_id, keep=keep)


def test_a_failing_body_delete_does_not_stop_the_sweep_and_is_tried_again(
    engine: sa.Engine, tmp_path: Path
) -> None:
    bodies = FailingDeletes(tmp_path / "bodies")
    stuck = store(engine, bodies, "stuck", FailedMessageStatus.ARCHIVED, 20)
    fine = store(engine, bodies, "fine", FailedMessageStatus.ARCHIVED, 20)
    bodies.refuse = {stuck}
    sweeper = RetentionSweeper(engine, bodies, retention_period=PERIOD, clock=lambda: at(0))

    result = sweeper.sweep_once()

    assert result is not None and result.deleted == 2 and result.body_failures == 1
    assert remaining(engine) == set()
    assert not (tmp_path / "bodies" / fine).exists()
    assert (tmp_path / "bodies" / stuck).exists()
    bodies.refuse = set()
    again = sweeper.sweep_once()
    assert again is not None and again.bodies_collected == 1 and again.body_failures == 0
    assert not (tmp_path / "bodies" / stuck).exists()


def test_the_comment_of_a_group_the_sweep_emptied_goes_with_it(
    engine: sa.Engine, tmp_path: Path
) -> None:
    bodies = FileSystemBodyStore(tmp_path / "bodies")
    store(engine, bodies, "old", FailedMessageStatus.ARCHIVED, 20)
    with engine.begin() as conn:
        group_ids = set(conn.execute(sa.select(failed_message_groups.c.group_id)).scalars())
        conn.execute(
            sa.insert(failed_message_group_comments),
            [{"group_id": g, "comment": "known issue", "updated_at": at(0)} for g in group_ids]
            + [{"group_id": "still-used-elsewhere", "comment": "keep", "updated_at": at(0)}],
        )
    assert group_ids

    RetentionSweeper(engine, bodies, retention_period=PERIOD, clock=lambda: at(0)).sweep_once()

    with engine.connect() as conn:
        left = set(conn.execute(sa.select(failed_message_group_comments.c.group_id)).scalars())
    assert left == {"still-used-elsewhere"}


def test_sweep_command_deletes_expired_rows(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from controlroom.cli import app
    from controlroom.db.engine import create_store_engine
    from controlroom.db.migrate import upgrade_database

    data_dir = tmp_path / "data"
    engine = create_store_engine(f"sqlite:///{data_dir / 'controlroom.db'}")
    upgrade_database(engine)
    store(
        engine,
        FileSystemBodyStore(data_dir / "bodies"),
        "old",
        FailedMessageStatus.ARCHIVED,
        10_000,
    )
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(data_dir))

    result = CliRunner().invoke(app, ["sweep"])

    assert result.exit_code == 0, result.output
    assert "Deleted 1 " in result.output
    assert remaining(engine) == set()


def test_sweep_command_fails_saying_why_while_another_process_sweeps(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from controlroom.cli import app
    from controlroom.db.engine import create_store_engine
    from controlroom.db.migrate import upgrade_database

    data_dir = tmp_path / "data"
    engine = create_store_engine(f"sqlite:///{data_dir / 'controlroom.db'}")
    upgrade_database(engine)
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(data_dir))
    other = provider_for(engine).make_lease(engine, LEASE_NAME, "serve-elsewhere", 60)
    assert other.hold()

    result = CliRunner().invoke(app, ["sweep"])

    assert result.exit_code == 1
    assert "another process" in result.output and "sweeping" in result.output


def test_retry_operations_completed_before_the_cutoff_are_purged_with_their_batches(
    engine: sa.Engine, tmp_path: Path
) -> None:
    from controlroom.db.tables import failed_message_retries, retry_batches, retry_operations

    def operation(op_id: str, completed_days_ago: float | None) -> None:
        completed = None if completed_days_ago is None else at(0) - completed_days_ago * DAY
        with engine.begin() as conn:
            conn.execute(
                sa.insert(retry_operations).values(
                    id=op_id,
                    retry_type="All",
                    message_count=1,
                    forwarded_count=1,
                    skipped_count=0,
                    failed=False,
                    acknowledged=False,
                    started_at=at(0) - 30 * DAY,
                    last_modified=at(0) - 30 * DAY,
                    completed_at=completed,
                )
            )
            conn.execute(
                sa.insert(retry_batches).values(
                    id=f"batch-{op_id}",
                    request_id=op_id,
                    retry_type="All",
                    status="done" if completed else "forwarding",
                    initial_batch_size=1,
                    started_at=at(0) - 30 * DAY,
                    last_modified=at(0) - 30 * DAY,
                )
            )
            conn.execute(
                sa.insert(failed_message_retries).values(
                    failed_message_id=f"message-{op_id}", retry_batch_id=f"batch-{op_id}"
                )
            )

    operation("old", 20)
    operation("young", 1)
    operation("unfinished", None)
    sweeper = RetentionSweeper(
        engine, FileSystemBodyStore(tmp_path / "b"), retention_period=PERIOD, clock=lambda: at(0)
    )

    sweeper.sweep_once()

    with engine.connect() as conn:
        assert set(conn.scalars(sa.select(retry_operations.c.id))) == {"young", "unfinished"}
        assert set(conn.scalars(sa.select(retry_batches.c.request_id))) == {"young", "unfinished"}
        claims = set(conn.scalars(sa.select(failed_message_retries.c.failed_message_id)))
    assert claims == {"message-young", "message-unfinished"}
