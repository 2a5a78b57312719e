"""docs/decisions.md "Parsing runs off the event loop": parsing failed messages (wire contract,
identity, body placement) runs off the event loop, so the API answers at its idle latency while
ingesting. Shown by the thread each parse runs on, not by timing: per provider, on the embedded
queue."""

from __future__ import annotations

import asyncio
import threading

import pytest
import sqlalchemy as sa

from controlroom.config import Settings
from controlroom.db.tables import failed_messages
from controlroom.errors.ingest import pipeline
from controlroom.transport.embedded import EmbeddedQueue
from tests.integration.test_ingestion import count, ingest_until, publish_all
from tests.nsb import failed_headers


def test_failed_messages_are_parsed_off_the_event_loop(
    settings: Settings, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed_on: list[int] = []
    real_parse = pipeline.parse_failed_message

    def recording_parse(*args, **kwargs):  # type: ignore[no-untyped-def]
        parsed_on.append(threading.get_ident())
        return real_parse(*args, **kwargs)

    monkeypatch.setattr(pipeline, "parse_failed_message", recording_parse)
    huge = b'{"text": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    messages = [(failed_headers(f"huge-{n}"), huge) for n in range(3)]

    async def scenario() -> int:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            await publish_all(transport, settings.error_queue, messages)
            await ingest_until(
                settings, engine, transport, lambda: count(engine, failed_messages) == 3
            )
        return threading.get_ident()

    loop_thread = asyncio.run(scenario())
    assert len(parsed_on) == 3
    assert loop_thread not in parsed_on
