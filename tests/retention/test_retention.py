"""Retention of Resolved and Archived failed messages (DESIGN.md "Retention"), per provider."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa

from controlroom.db.tables import FailedMessageStatus, failed_message_groups, failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.retention import RetentionSweeper
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


def test_only_the_lease_holder_sweeps(engine: sa.Engine, tmp_path: Path) -> None:
    bodies = FileSystemBodyStore(tmp_path / "bodies")
    store(engine, bodies, "old-resolved", FailedMessageStatus.RESOLVED, 20)
    first = RetentionSweeper(engine, bodies, retention_period=PERIOD, clock=lambda: at(0))
    second = RetentionSweeper(engine, bodies, retention_period=PERIOD, clock=lambda: at(0))

    assert first.sweep_once() is not None
    assert second.sweep_once() is None
    assert remaining(engine) == set()


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
