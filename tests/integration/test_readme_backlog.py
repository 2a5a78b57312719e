"""README.md's "The producer side" program, run as written: the backlog it publishes is
ingested as exactly one failed message per message id, each with one attempt. Every
provider, on the embedded queue."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.transport.embedded import EmbeddedQueue

COUNT = 1_200  # past the program's rounds of 500
TIMEOUT = 120  # seconds


def readme_producer() -> str:
    """The Python program of README.md's "The producer side" section."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("### The producer side", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def stored(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(failed_messages)).scalar_one()


def test_the_readme_backlog_is_one_failed_message_per_message_id(
    settings: Settings,
    engine: sa.Engine,
    body_store: FileSystemBodyStore,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", settings.effective_database_url)
    for name in ("CONTROLROOM_CONFIG", "CONTROLROOM_BROKER_URL", "CONTROLROOM_ERROR_QUEUE"):
        monkeypatch.delenv(name, raising=False)
    program: dict[str, object] = {"__name__": "readme_producer"}
    exec(compile(readme_producer(), "README.md", "exec"), program)
    publish_backlog = program["publish_backlog"]
    assert callable(publish_backlog)
    asyncio.run(publish_backlog(COUNT))
    asyncio.run(publish_backlog(2, "second"))  # another prefix: new rows
    script = tmp_path / "publish_backlog.py"  # and run as the README says
    script.write_text(readme_producer())
    ran = subprocess.run(
        [sys.executable, str(script), "3", "third"], capture_output=True, timeout=TIMEOUT
    )
    assert ran.returncode == 0, ran.stderr.decode()

    async def drain() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            ingestion = IngestionService(settings, engine, transport, body_store)
            run = asyncio.create_task(ingestion.run())
            try:
                while stored(engine) < COUNT + 5:
                    assert not run.done(), run.exception()
                    await asyncio.sleep(0.1)
            finally:
                await ingestion.stop()
                await asyncio.gather(run, return_exceptions=True)

    asyncio.run(asyncio.wait_for(drain(), TIMEOUT))
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                failed_messages.c.message_id,
                failed_messages.c.status,
                failed_messages.c.number_of_processing_attempts,
                failed_messages.c.message_type,
                failed_messages.c.exception_type,
            )
        ).all()
    assert sorted(row.message_id for row in rows) == sorted(
        [f"backlog-{n}" for n in range(COUNT)]
        + ["second-0", "second-1", "third-0", "third-1", "third-2"]
    )
    assert {tuple(row[1:]) for row in rows} == {
        (FailedMessageStatus.UNRESOLVED, 1, "Shop.Messages.PlaceOrder", "System.TimeoutException")
    }
