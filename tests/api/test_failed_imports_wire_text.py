"""Failed imports whose headers are not UTF-8 (a transport hands such bytes over as lone
surrogates) on every failed-import route: the API's list, re-import of one and of all, the
console's page and its two actions, and ``controlroom import-failed`` (``--list``,
``--id``, all), per provider. Nothing answers 500 or crashes; every text off the wire is
shown with its bytes escaped (``\\xff``); one import that cannot go back on a queue is
reported and kept while the rest are re-imported (docs/decisions.md "Headers that are not
UTF-8 make a failed import")."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path

import httpx
import hypothesis
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from controlroom.app import create_app
from controlroom.cli import app as cli_app
from controlroom.client import open_transport
from controlroom.config import Settings
from controlroom.db.engine import store_identity
from controlroom.db.tables import failed_error_imports
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import make_failed_import
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedImport
from controlroom.runtime import serve_lock
from controlroom.transport.embedded import EmbeddedQueue
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.web.test_console_http import csrf_of

MESSAGE_ID = "NServiceBus.MessageId"
BAD_ID = "\udcff\udcfe-id"  # an AMQP message_id of bytes ff fe 2d 69 64
SURROGATE = re.compile("[\ud800-\udfff]")

# Text as a transport hands it over: any character, and bytes that were not UTF-8 as the
# lone surrogates U+DC80..U+DCFF (surrogateescape).
wire_text = st.text(
    alphabet=st.one_of(st.characters(), st.integers(0xDC80, 0xDCFF).map(chr)), max_size=12
)
wire_headers = st.dictionaries(
    wire_text.filter(lambda name: name != MESSAGE_ID), st.none() | wire_text, max_size=4
)
FUZZ = hypothesis.settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)


def is_utf8(headers: dict[str, str | None]) -> bool:
    return not any(SURROGATE.search(t) for item in headers.items() for t in item if t)


def keep(engine: sa.Engine, extra: list[dict[str, str | None]]) -> list[FailedImport]:
    """Replace every failed import with the odd one of the report (no
    ``NServiceBus.MessageId`` header: its id from the AMQP property), a plain one, and one
    per ``extra`` headers."""
    with engine.begin() as conn:
        conn.execute(sa.delete(failed_error_imports))
    headers = [{MESSAGE_ID: BAD_ID}, {MESSAGE_ID: "fine-1", "a": "b"}, *extra]
    kept = {
        item.id: item
        for n, one in enumerate(headers)
        for item in [make_failed_import(one, b"\xff%d" % n, queue="error", reason="no FailedQ")]
    }
    FailedMessageBatchWriter(engine).write(IngestionBatch(failed_imports=list(kept.values())))
    return list(kept.values())


def remaining(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.scalars(sa.select(failed_error_imports.c.id)))


def assert_escaped(text: str) -> None:
    assert not SURROGATE.search(text)
    assert "\\xff\\xfe-id" in text  # the odd message id, its bytes escaped


def test_the_api_lists_and_reimports_failed_imports_of_any_text(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            app = create_app(settings, engine, body_store, transport=transport)

            @FUZZ
            @given(extra=st.lists(wire_headers, max_size=3))
            def example(client: TestClient, extra: list[dict[str, str | None]]) -> None:
                kept = keep(engine, extra)
                listed = client.get("/api/failed-imports", params={"per_page": 50})
                assert listed.status_code == 200, listed.text
                assert len(listed.json()) == len(kept)
                assert not SURROGATE.search(listed.content.decode("utf-8"))
                assert {MESSAGE_ID: "\\xff\\xfe-id"} in [i["headers"] for i in listed.json()]

                bad, fine = kept[0], kept[1]
                refused = client.post(f"/api/failed-imports/{bad.id}/reimport")
                assert refused.status_code == 422, refused.text
                assert client.post(f"/api/failed-imports/{fine.id}/reimport").status_code == 202

                everything = client.post("/api/failed-imports/reimport-all")
                assert everything.status_code == 202, everything.text
                stuck = {i.id for i in kept[2:] if not is_utf8(json.loads(i.headers_json))}
                assert everything.json()["unreadable"] == 1 + len(stuck)
                assert remaining(engine) == {bad.id} | stuck

            def calls() -> None:
                with TestClient(app) as client:
                    example(client)

            await asyncio.to_thread(calls)

    asyncio.run(scenario())


def test_the_console_lists_and_reimports_failed_imports_of_any_text(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            app = create_app(settings, engine, body_store, transport=transport)

            @FUZZ
            @given(extra=st.lists(wire_headers, max_size=3))
            def example(console: TestClient, extra: list[dict[str, str | None]]) -> None:
                kept = keep(engine, extra)
                page = console.get("/failed-imports")
                assert page.status_code == 200, page.text
                assert_escaped(page.content.decode("utf-8"))
                token = csrf_of(page.text)

                bad = kept[0]
                form = {"csrf_token": token}
                one = console.post(f"/failed-imports/{bad.id}/reimport", data=form)
                assert one.status_code == 303
                everything = console.post("/failed-imports/reimport-all", data=form)
                assert everything.status_code == 303
                stuck = {i.id for i in kept[2:] if not is_utf8(json.loads(i.headers_json))}
                assert remaining(engine) == {bad.id} | stuck
                after = console.get(everything.headers["location"])
                assert after.status_code == 200
                assert f"{1 + len(stuck)} could not go back on a queue" in after.text

            def calls() -> None:
                with TestClient(app, follow_redirects=False) as console:
                    example(console)

            await asyncio.to_thread(calls)

    asyncio.run(scenario())


@pytest.fixture
def cli_env(
    tmp_path: Path, database_url: str, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> Path:
    for name in ("CONTROLROOM_CONFIG", "CONTROLROOM_BROKER_URL", "CONTROLROOM_ERROR_QUEUE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CONTROLROOM_DATA_DIR", str(tmp_path / "cli-data"))
    monkeypatch.setenv("CONTROLROOM_DATABASE_URL", database_url)
    # A data directory a serve of the store has run on: its embedded queue is read.
    with serve_lock.serving(tmp_path / "cli-data", store=store_identity(engine), broker="embedded"):
        pass
    return tmp_path / "cli-data"


def test_import_failed_lists_and_reimports_failed_imports_of_any_text(
    cli_env: Path, engine: sa.Engine
) -> None:
    runner = CliRunner()

    @FUZZ
    @given(extra=st.lists(wire_headers, max_size=3))
    def example(extra: list[dict[str, str | None]]) -> None:
        kept = keep(engine, extra)
        listed = runner.invoke(cli_app, ["import-failed", "--list"])
        assert listed.exit_code == 0, listed.output
        assert f"{len(kept)} failed import" in listed.output
        assert not SURROGATE.search(listed.output)

        bad = kept[0]
        one = runner.invoke(cli_app, ["import-failed", "--id", bad.id])
        assert one.exit_code == 1 and isinstance(one.exception, SystemExit), one.output
        assert f"kept {bad.id}" in one.output

        everything = runner.invoke(cli_app, ["import-failed"])
        assert isinstance(everything.exception, SystemExit), everything.output
        stuck = {i.id for i in kept[2:] if not is_utf8(json.loads(i.headers_json))}
        assert everything.exit_code == 1
        assert f"Re-published {len(kept) - 1 - len(stuck)} of {len(kept)}" in everything.output
        assert remaining(engine) == {bad.id} | stuck

    example()


def test_every_console_page_prints_text_off_the_wire_with_its_bytes_escaped() -> None:
    from controlroom.web.common import templates

    page = templates.env.from_string("<p>{{ value }}</p>").render(value=BAD_ID)
    assert page.encode("utf-8") == b"<p>\\xff\\xfe-id</p>"


def test_a_bulk_reimport_reports_a_refused_publish_and_reimports_the_rest(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore, rabbitmq_url: str
) -> None:
    """RabbitMQ refuses a message whose header is larger than the connection's frame_max
    (a real refusal, before anything is sent): that import is kept and reported, the
    others go back to the queue."""
    settings = settings.model_copy(
        update={"broker_url": rabbitmq_url, "error_queue": f"error-{uuid.uuid4().hex[:8]}"}
    )
    huge = make_failed_import({"big": "x" * 200_000}, b"{}", queue="error", reason="no FailedQ")
    fine = [
        make_failed_import({MESSAGE_ID: f"fine-{n}"}, b"{}", queue="error", reason="no FailedQ")
        for n in range(2)
    ]
    FailedMessageBatchWriter(engine).write(IngestionBatch(failed_imports=[huge, *fine]))

    async def scenario() -> dict[str, object]:
        async with open_transport(settings) as transport:
            # On the transport's own loop, as in serve (RabbitMQ's channels belong to it).
            app = create_app(settings, engine, body_store, transport=transport)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app),
                base_url="http://127.0.0.1",
                timeout=TEST_CLIENT_TIMEOUT,
            ) as client:
                answer = await client.post("/api/failed-imports/reimport-all")
            assert answer.status_code == 202, answer.text
            await transport.purge(settings.error_queue)
            result: dict[str, object] = answer.json()
            return result

    answer = asyncio.run(scenario())
    assert answer["republished"] == 2 and answer["failed"] == 1
    assert answer["kept"] == [{"id": huge.id, "reason": answer["kept"][0]["reason"]}]  # type: ignore[index]
    assert "frame_max" in str(answer["kept"])
    assert remaining(engine) == {huge.id}


def test_a_single_reimport_the_broker_cannot_take_answers_422_and_keeps_it(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore, rabbitmq_url: str
) -> None:
    """The same refusal for one import: a 422 naming why, never a 500; the import stays."""
    settings = settings.model_copy(
        update={"broker_url": rabbitmq_url, "error_queue": f"error-{uuid.uuid4().hex[:8]}"}
    )
    huge = make_failed_import({"big": "x" * 200_000}, b"{}", queue="error", reason="no FailedQ")
    FailedMessageBatchWriter(engine).write(IngestionBatch(failed_imports=[huge]))

    async def scenario() -> httpx.Response:
        async with open_transport(settings) as transport:
            app = create_app(settings, engine, body_store, transport=transport)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app),
                base_url="http://127.0.0.1",
                timeout=TEST_CLIENT_TIMEOUT,
            ) as client:
                answer = await client.post(f"/api/failed-imports/{huge.id}/reimport")
            await transport.purge(settings.error_queue)
            return answer

    answer = asyncio.run(scenario())
    assert answer.status_code == 422, answer.text
    assert "frame_max" in answer.json()["detail"]
    assert remaining(engine) == {huge.id}
