"""A retry processor that stops dead after staging, for the restart test.

Run as ``python -m tests.retries.crashing_processor <json settings> <marker file>``: it
stages every pending batch, then, where it would forward, writes the marker file and
sleeps until the test kills it with SIGKILL (no cleanup of any kind runs).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.retries.processor import RetryProcessor
from controlroom.transport import create_transport


class StopsBeforeForwarding(RetryProcessor):
    marker: Path

    async def _forward(self, batch_id: str) -> None:
        self.marker.write_text(batch_id)
        await asyncio.sleep(3600)  # killed here


async def main(settings: Settings, marker: Path) -> None:
    engine = create_store_engine(settings.effective_database_url)
    transport = create_transport(settings)
    await transport.start()
    processor = StopsBeforeForwarding(
        settings, engine, transport, FileSystemBodyStore(settings.body_dir), lease_seconds=1.0
    )
    processor.marker = marker
    await processor.process_pending()


if __name__ == "__main__":
    asyncio.run(main(Settings(**json.loads(sys.argv[1])), Path(sys.argv[2])))
