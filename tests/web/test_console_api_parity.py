"""The console and the API do not diverge (docs/decisions.md "The console calls the same
functions as the API"): each operator action is taken once through the API and once by
the console's form POST, on two subjects of the same shape, and the event log items,
the audit log and the resulting state must be the same (ids aside), on every provider.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.db.tables import audit_log, event_log_items, failed_messages, known_endpoints
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt
from tests.nsb import failed_headers
from tests.retries.conftest import store_failed
from tests.web.test_console_http import csrf_of

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
    ev, fm, ke = event_log_items.c, failed_messages.c, known_endpoints.c
    with engine.connect() as conn:
        events = conn.execute(
            sa.select(
                ev.id, ev.event_type, ev.category, ev.severity, ev.description, ev.related_to_json
            )
        ).all()
        al = audit_log.c
        audit = conn.execute(
            sa.select(
                al.event_id, al.actor, al.action, al.outcome, al.correlation_id, al.details_json
            )
        ).all()
        statuses = conn.execute(
            sa.select(fm.status).where(fm.id.in_(chosen.ids)).order_by(fm.id)
        ).scalars()
        monitored = conn.execute(
            sa.select(ke.monitored).where(ke.id == chosen.endpoint_id)
        ).scalar_one()
    return Outcome(
        events=[alike(row) for row in events],
        audit=[alike(row) for row in audit],
        statuses=list(statuses),
        monitored=monitored,
    )


def alike(row: sa.Row[Any]) -> tuple[str, ...]:
    """The row's own id, then its texts with every id replaced, so two subjects' rows
    compare equal."""
    own, *rest = row
    texts = [json.dumps(value) if isinstance(value, list) else str(value) for value in rest]
    return (str(own), *(UUID.sub("<id>", text) for text in texts))
