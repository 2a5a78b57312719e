"""The console and the API do not diverge (docs/decisions.md "The console calls the same
functions as the API"): each operator action is taken once through the API and once by
the console's form POST, on two subjects of the same shape, and the event log items,
the audit log and the resulting state must be the same (ids aside), on every provider.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import Settings
from controlroom.db.tables import (
    audit_log,
    event_log_items,
    failed_messages,
    known_endpoints,
    notifications,
    site_calls,
)
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.pipeline import make_failed_import
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt
from controlroom.transport.embedded import EmbeddedQueue
from tests.notifications.test_api import put as put_notification
from tests.nsb import failed_headers
from tests.reconciliation.harness import as_site, site_entry
from tests.retries.conftest import store_failed
from tests.site.http import serving
from tests.web.test_console_http import csrf_of
from tests.web.test_console_sitecalls import packet

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


@dataclass(frozen=True)
class Subject:
    """What one way of taking the action acts on: messages, their group, an endpoint."""

    ids: list[str]
    group_id: str
    endpoint_id: str


@dataclass(frozen=True)
class Outcome:
    """Events and audit events (each with its own id first), the subject's state."""

    events: list[tuple[str, ...]]
    audit: list[tuple[str, ...]]
    statuses: list[int]
    monitored: bool

    def since(self, before: Outcome) -> Outcome:
        """What was added since ``before`` (ids dropped, sorted), and the state now."""
        return Outcome(
            events=added(before.events, self.events),
            audit=added(before.audit, self.audit),
            statuses=self.statuses,
            monitored=self.monitored,
        )


def added(before: list[tuple[str, ...]], after: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    seen = {row[0] for row in before}
    return sorted(row[1:] for row in after if row[0] not in seen)


Setup = Callable[[TestClient, Subject], None]
Act = Callable[[TestClient, Subject], None]


def form(console: TestClient, path: str, **fields: Any) -> None:
    """A console form POST, as the page's form sends it; it must answer 303."""
    data = {"csrf_token": csrf_of(console.get("/groups").text), **fields}
    answer = console.post(path, data=data)
    assert answer.status_code == 303, answer.text
    shown = console.get(answer.headers["location"])
    assert shown.status_code == 200 and 'data-testid="flash"' not in shown.text, shown.text


def api(console: TestClient, method: str, path: str, body: Any = None) -> None:
    answer = console.request(method, path, json=body)
    assert answer.status_code in (200, 202, 204), answer.text


ACTIONS: dict[str, tuple[Setup | None, Act, Act]] = {
    "archive one": (
        None,
        lambda c, s: api(c, "POST", f"/api/errors/{s.ids[0]}/archive"),
        lambda c, s: form(c, f"/messages/{s.ids[0]}/archive"),
    ),
    "archive selected": (
        None,
        lambda c, s: api(c, "POST", "/api/errors/archive", s.ids[:2]),
        lambda c, s: form(c, "/messages/bulk", action="archive", ids=s.ids[:2]),
    ),
    "unarchive one": (
        lambda c, s: api(c, "POST", "/api/errors/archive", s.ids),
        lambda c, s: api(c, "PATCH", "/api/errors/unarchive", s.ids[:1]),
        lambda c, s: form(c, f"/messages/{s.ids[0]}/unarchive"),
    ),
    "unarchive selected": (
        lambda c, s: api(c, "POST", "/api/errors/archive", s.ids),
        lambda c, s: api(c, "PATCH", "/api/errors/unarchive", s.ids[1:]),
        lambda c, s: form(c, "/messages/bulk", action="unarchive", ids=s.ids[1:]),
    ),
    "retry one": (
        None,
        lambda c, s: api(c, "POST", f"/api/errors/{s.ids[0]}/retry"),
        lambda c, s: form(c, f"/messages/{s.ids[0]}/retry"),
    ),
    "retry selected": (
        None,
        lambda c, s: api(c, "POST", "/api/errors/retry", s.ids[:2]),
        lambda c, s: form(c, "/messages/bulk", action="retry", ids=s.ids[:2]),
    ),
    "retry group": (
        None,
        lambda c, s: api(c, "POST", f"/api/recoverability/groups/{s.group_id}/errors/retry"),
        lambda c, s: form(c, f"/groups/{s.group_id}/retry"),
    ),
    "archive group": (
        None,
        lambda c, s: api(c, "POST", f"/api/recoverability/groups/{s.group_id}/errors/archive"),
        lambda c, s: form(c, f"/groups/{s.group_id}/archive"),
    ),
    "monitor endpoint": (
        None,
        lambda c, s: api(
            c, "PATCH", f"/api/endpoints/{s.endpoint_id}", {"monitor_heartbeat": True}
        ),
        lambda c, s: form(c, f"/endpoints/{s.endpoint_id}/monitored", monitored="true"),
    ),
}


@pytest.mark.parametrize("action", ACTIONS)
def test_an_action_through_the_api_and_through_the_console_has_the_same_outcome(
    console: TestClient,
    engine: sa.Engine,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    action: str,
) -> None:
    setup, through_api, through_console = ACTIONS[action]

    def put(headers: dict[str, str | None]) -> FailedAttempt:
        attempt = store_failed(settings, writer, body_store, headers)
        writer.write(IngestionBatch(endpoints=list(attempt.endpoints)))  # as the pipeline
        return attempt

    by_api, by_console = subject(console, put, "Alpha"), subject(console, put, "Bravo")
    outcomes = []
    for way, chosen in ((through_api, by_api), (through_console, by_console)):
        if setup is not None:
            setup(console, chosen)
        before = snapshot(engine, chosen)
        way(console, chosen)
        outcomes.append(snapshot(engine, chosen).since(before))
    api_outcome, console_outcome = outcomes
    assert api_outcome.events, "the action logs an event"
    assert console_outcome == api_outcome


def subject(console: TestClient, put: Callable[..., FailedAttempt], name: str) -> Subject:
    """Three failed messages of endpoint ``name``, in one group of their own."""
    attempts = [
        put(failed_headers(f"{name}-{n}", endpoint=name, exception_type=f"Shop.{name}Exception"))
        for n in range(3)
    ]
    ids = sorted(attempt.unique_message_id for attempt in attempts)
    groups = console.get("/api/recoverability/groups").json()
    (group,) = [g for g in groups if g["title"].startswith(f"Shop.{name}Exception")]
    endpoints = console.get("/api/endpoints/known").json()
    (endpoint,) = [e for e in endpoints if e["endpoint_details"]["name"] == name]
    return Subject(ids=ids, group_id=group["id"], endpoint_id=endpoint["id"])


def snapshot(engine: sa.Engine, chosen: Subject) -> Outcome:
    """The event log and the audit log, ids made alike; the subject's state."""
    fm, ke = failed_messages.c, known_endpoints.c
    events, audit = logs(engine)
    with engine.connect() as conn:
        statuses = conn.execute(
            sa.select(fm.status).where(fm.id.in_(chosen.ids)).order_by(fm.id)
        ).scalars()
        monitored = conn.execute(
            sa.select(ke.monitored).where(ke.id == chosen.endpoint_id)
        ).scalar_one()
        return Outcome(events=events, audit=audit, statuses=list(statuses), monitored=monitored)


def alike(row: sa.Row[Any]) -> tuple[str, ...]:
    """The row's own id, then its texts with every id replaced, so two subjects' rows
    compare equal."""
    own, *rest = row
    texts = [json.dumps(value) if isinstance(value, list) else str(value) for value in rest]
    return (str(own), *(UUID.sub("<id>", text) for text in texts))


@pytest.mark.parametrize("command", ["retry", "discard"])
def test_a_site_call_relay_through_the_api_and_through_the_console_has_the_same_outcome(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore, command: str
) -> None:
    site = FastAPI()

    @site.post("/site/tracking/{call_id}/{verb}")
    def applied(call_id: str, verb: str) -> dict[str, str]:
        return {"outcome": "Applied"}

    with serving(site) as site_url:
        central = settings.model_copy(update={"sites": [site_entry("plant-7", site_url)]})
        app = create_app(central, engine, body_store)
        with TestClient(app, follow_redirects=False) as console:
            created = datetime.now(UTC) - timedelta(minutes=5)
            calls = [packet("Parked", created=created, last_error="503") for _ in range(2)]
            telemetry = console.post(
                "/api/site-calls/telemetry", json=calls, headers=as_site("plant-7")
            )
            assert telemetry.status_code == 200 and telemetry.json()["rejected"] == []
            by_api, by_console = (call["tracked_operation_id"] for call in calls)
            outcomes = []
            for way, call_id in (("api", by_api), ("console", by_console)):
                before = logs(engine)
                if way == "api":
                    api(console, "POST", f"/api/site-calls/{call_id}/{command}")
                else:
                    answer = console.post(
                        f"/site-calls/{call_id}/{command}",
                        data={"csrf_token": csrf_of(console.get(f"/site-calls/{call_id}").text)},
                    )
                    assert answer.status_code == 303
                    assert "Applied" in console.get(answer.headers["location"]).text
                after = logs(engine)
                outcomes.append(
                    (
                        added(before[0], after[0]),
                        added(before[1], after[1]),
                        status(engine, call_id),
                    )
                )
    api_outcome, console_outcome = outcomes
    assert api_outcome[0] and api_outcome[1], "an applied relay logs an event and an audit event"
    assert console_outcome == api_outcome


def logs(engine: sa.Engine) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """The event log and the audit log, ids made alike (``alike``)."""
    ev, al = event_log_items.c, audit_log.c
    with engine.connect() as conn:
        events = conn.execute(
            sa.select(
                ev.id, ev.event_type, ev.category, ev.severity, ev.description, ev.related_to_json
            )
        ).all()
        audit = conn.execute(
            sa.select(
                al.event_id, al.actor, al.action, al.outcome, al.correlation_id, al.details_json
            )
        ).all()
    return [alike(row) for row in events], [alike(row) for row in audit]


def status(engine: sa.Engine, call_id: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                sa.select(site_calls.c.status).where(site_calls.c.tracked_operation_id == call_id)
            ).scalar_one()
        )


def test_reimport_and_edit_through_the_api_and_through_the_console_have_the_same_outcome(
    settings: Settings,
    engine: sa.Engine,
    body_store: FileSystemBodyStore,
    writer: FailedMessageBatchWriter,
) -> None:
    kept = [make_failed_import({"n": str(n)}, b"\xff", queue="error", reason="r") for n in (1, 2)]
    writer.write(IngestionBatch(failed_imports=kept))
    edited = {
        way: failed_headers(f"edit-{way}", endpoint=f"Edit{way}", exception_type=f"E.{way}")
        for way in ("api", "console")
    }
    ids = {
        way: store_failed(settings, writer, body_store, h).unique_message_id
        for way, h in edited.items()
    }
    by_way: dict[str, list[Any]] = {}

    async def scenario() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            app = create_app(settings, engine, body_store, transport=transport)

            def calls() -> None:  # the test client's loop is another thread's
                with TestClient(app, follow_redirects=False) as console:
                    for way, failed_import in (("api", kept[0]), ("console", kept[1])):
                        before = logs(engine)
                        # The API refuses a null header value (400); the console's form
                        # keeps it: the edit sends the stored headers that have a value.
                        headers = {k: v for k, v in edited[way].items() if v is not None}
                        edit = {"message_body": '{"fixed": true}', "message_headers": headers}
                        if way == "api":
                            api(console, "POST", f"/api/failed-imports/{failed_import.id}/reimport")
                            api(console, "POST", f"/api/edit/{ids[way]}", edit)
                        else:
                            form(console, f"/failed-imports/{failed_import.id}/reimport")
                            form(
                                console,
                                f"/messages/{ids[way]}/edit",
                                body=edit["message_body"],
                                headers=json.dumps(edit["message_headers"]),
                            )
                        after = logs(engine)
                        by_way[way] = [
                            added(before[0], after[0]),
                            added(before[1], after[1]),
                            message_status(engine, ids[way]),
                        ]

            await asyncio.to_thread(calls)

    asyncio.run(scenario())
    assert by_way["api"][0], "a re-import logs an event"
    assert by_way["console"] == by_way["api"]


def message_status(engine: sa.Engine, failed_message_id: str) -> int:
    with engine.connect() as conn:
        query = sa.select(failed_messages.c.status).where(failed_messages.c.id == failed_message_id)
        return int(conn.execute(query).scalar_one())


@pytest.mark.parametrize("command", ["retry", "discard"])
def test_a_notification_action_through_the_api_and_through_the_console_has_the_same_outcome(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore, command: str
) -> None:
    by_api, by_console = (put_notification(engine) for _ in range(2))
    with TestClient(create_app(settings, engine, body_store), follow_redirects=False) as console:
        outcomes = []
        for way, notification_id in (("api", by_api), ("console", by_console)):
            before = logs(engine)
            if way == "api":
                api(console, "POST", f"/api/notifications/{notification_id}/{command}")
            else:
                page = console.get(f"/notifications/{notification_id}")
                answer = console.post(
                    f"/notifications/{notification_id}/{command}",
                    data={"csrf_token": csrf_of(page.text)},
                )
                assert answer.status_code == 303, answer.text
            after = logs(engine)
            outcomes.append(
                (
                    added(before[0], after[0]),
                    added(before[1], after[1]),
                    notification_status(engine, notification_id),
                )
            )
    api_outcome, console_outcome = outcomes
    assert api_outcome[0] and api_outcome[1], "an applied action logs an event and an audit event"
    assert console_outcome == api_outcome


def notification_status(engine: sa.Engine, notification_id: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                sa.select(notifications.c.status).where(
                    notifications.c.notification_id == notification_id
                )
            ).scalar_one()
        )
