"""The calls a ServiceControl client (ServicePulse) makes, recorded as one flow and
replayed against the whole process on the embedded queue, on every provider.

Failed messages reach the error queue as NServiceBus puts them there; ingestion, the
retry processor and the API run side by side as ``controlroom serve`` runs them; an
endpoint consumes the retried message and confirms it with
``controlroom.client.confirm_successful_retry``. The client opens the groups view, opens
a group, opens a message (``errors/last``, search by message id, the body through
``body_url``), retries it and polls until it is ``resolved``; then archives another and
polls until it is ``archived``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import sqlalchemy as sa

from controlroom.app import create_app
from controlroom.client import publish_failed_message
from controlroom.config import Settings
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.grouping import EXCEPTION_TYPE_AND_STACK_TRACE
from controlroom.errors.ingest.pipeline import IngestionService
from controlroom.errors.retries import wire as retry_wire
from controlroom.transport.embedded import EmbeddedQueue
from tests.nsb import failed_headers
from tests.retries.conftest import TIMEOUT, make_processor
from tests.retries.endpoint import FlakyEndpoint
from tests.servers import TEST_CLIENT_TIMEOUT

ENDPOINT = "Sales"


async def poll(api: httpx.AsyncClient, url: str, done: Callable[[Any], bool], **params: Any) -> Any:
    """GET ``url`` until ``done(json)``, as a UI refreshes a view; the last answer."""
    while True:
        response = await api.get(url, params=params)
        assert response.status_code == 200, f"{url}: {response.status_code} {response.text}"
        if done(response.json()):
            return response.json()
        await asyncio.sleep(0.1)


async def client_flow(
    api: httpx.AsyncClient, transport: EmbeddedQueue, settings: Settings
) -> dict[str, Any]:
    """The recorded calls; returns what the endpoint and the client saw."""
    bodies = {str(uuid.uuid4()): f'{{"order": {n}}}'.encode() for n in range(2)}
    for message_id, body in bodies.items():
        await publish_failed_message(
            transport,
            failed_headers(message_id, endpoint=ENDPOINT),
            body,
            error_queue=settings.error_queue,
        )
    retried_id, archived_id = bodies

    # The UI checks which ServiceControl it talks to.
    root = await api.get("/api/")
    assert root.status_code == 200
    assert root.headers["X-Particular-Version"] == "6.15.0"
    assert (await api.get("/api/license")).json()["license_status"] == "Valid"

    # Groups view (the default classifier), refreshed until ingestion stored both.
    groups = await poll(
        api,
        "/api/recoverability/groups/",
        lambda found: sum(group["count"] for group in found) == 2,
        classifierFilter="undefined",
    )
    (group,) = groups
    assert group["type"] == EXCEPTION_TYPE_AND_STACK_TRACE
    assert group["operation_status"] == "None"

    # Open the group: its failed messages, newest failure first.
    page = await api.get(
        f"/api/recoverability/groups/{group['id']}/errors",
        params={"page": 1, "per_page": 50, "sort": "time_of_failure", "direction": "desc"},
    )
    assert page.status_code == 200 and page.headers["Total-Count"] == "2"
    by_message_id = {item["message_id"]: item for item in page.json()}
    assert by_message_id.keys() == bodies.keys()
    message = by_message_id[retried_id]

    # Open a message: the latest view, then search by its message id, then its body.
    last = await api.get(f"/api/errors/last/{message['id']}")
    assert last.status_code == 200
    assert last.json()["status"] == "unresolved" and last.json()["edited"] is False
    found = await api.get(f"/api/messages/search/{retried_id}")
    assert found.headers["Total-Count"] == "1"
    (hit,) = found.json()
    assert (hit["id"], hit["message_id"], hit["status"]) == (message["id"], retried_id, "failed")
    body = await api.get(f"/api{hit['body_url']}")
    assert body.status_code == 200
    assert body.content == bodies[retried_id]
    assert body.headers["content-type"] == "application/json"

    # Retry it; the endpoint processes it and confirms; poll until resolved.
    retry = await api.post("/api/errors/retry", json=[message["id"]])
    assert retry.status_code == 202, retry.text
    resolved = await poll(
        api, f"/api/errors/last/{message['id']}", lambda view: view["status"] == "resolved"
    )

    # Archive the other; poll until archived.
    other = by_message_id[archived_id]
    archive = await api.patch("/api/errors/archive/", json=[other["id"]])
    assert archive.status_code == 202, archive.text
    archived = await poll(
        api, f"/api/errors/last/{other['id']}", lambda view: view["status"] == "archived"
    )
    archived_groups = await api.get("/api/errors/groups/")
    assert [(g["id"], g["count"]) for g in archived_groups.json()] == [(group["id"], 1)]
    remaining = await api.get("/api/recoverability/groups/")
    assert remaining.json() == []  # nothing Unresolved is left
    return {
        "bodies": bodies,
        "message": message,
        "resolved": resolved,
        "archived": archived,
    }


def test_a_service_control_client_retries_one_message_and_archives_another(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> None:
    async def scenario() -> tuple[dict[str, Any], FlakyEndpoint]:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            processor = make_processor(settings, engine, transport, body_store)
            ingestion = IngestionService(settings, engine, transport, body_store)
            app = create_app(
                settings, engine, body_store, transport=transport, retry_processor=processor
            )
            api = httpx.AsyncClient(
                transport=httpx.ASGITransport(app),
                base_url="http://test",
                timeout=TEST_CLIENT_TIMEOUT,
            )
            endpoint = FlakyEndpoint(
                transport,
                queue=ENDPOINT,
                error_queue=settings.error_queue,
                address=ENDPOINT,
                fail_times=0,  # processes every message it gets, and confirms retries
            )
            tasks = [asyncio.create_task(processor.run()), asyncio.create_task(ingestion.run())]
            try:
                async with api, endpoint, asyncio.timeout(TIMEOUT):
                    return await client_flow(api, transport, settings), endpoint
            finally:
                await ingestion.stop()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await processor.close()

    seen, endpoint = asyncio.run(scenario())

    (delivery,) = endpoint.processed  # the retried message, exactly once
    message = seen["message"]
    assert delivery.body == seen["bodies"][message["message_id"]]
    assert delivery.headers[retry_wire.RETRY_UNIQUE_MESSAGE_ID] == message["id"]
    assert endpoint.confirmed == [True]
    assert seen["resolved"]["id"] == message["id"]
    assert seen["archived"]["status"] == "archived"
