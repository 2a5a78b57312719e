"""ServiceControl's leniency on the failed-message lists (docs/decisions.md "List
parameters are read leniently, as ServiceControl reads them"): what ServicePulse sends
must never be refused. An empty or unknown ``sort`` is the default sort, an unknown
``direction`` the default direction, an unknown ``status`` is no filter, an empty
``queueaddress`` is no filter; the queue address matches case-insensitively and is also
read as ``queueAddress``."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.model import FailedAttempt
from tests.factories import at
from tests.nsb import failed_headers
from tests.retries.conftest import set_status, store_failed


@pytest.fixture
def stored(
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    engine: sa.Engine,
) -> list[FailedAttempt]:
    """Three failed messages from two queues (``Sales`` twice, ``Billing``), one archived."""
    attempts = [
        store_failed(
            settings,
            writer,
            body_store,
            failed_headers(f"msg-{n}", endpoint=endpoint, failed_at=at(n)),
        )
        for n, endpoint in enumerate(("Sales", "Sales", "Billing"))
    ]
    set_status(engine, attempts[0].unique_message_id, FailedMessageStatus.ARCHIVED)
    return attempts


def ids(response: Any) -> list[str]:
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()]


@pytest.mark.parametrize("sort", ["", "no_such_key", "processed_at"])
def test_an_empty_or_unknown_sort_is_the_default_sort(
    client: TestClient, stored: list[FailedAttempt], sort: str
) -> None:
    default = ids(client.get("/api/errors", params={"direction": "desc"}))
    answer = client.get("/api/errors", params={"sort": sort, "direction": "desc"})
    assert ids(answer) == default
    assert answer.headers["Total-Count"] == "3"


def test_an_unknown_direction_is_the_default_direction(
    client: TestClient, stored: list[FailedAttempt]
) -> None:
    default = ids(client.get("/api/errors"))
    assert ids(client.get("/api/errors", params={"direction": "sideways"})) == default
    assert ids(client.get("/api/errors", params={"direction": ""})) == default


def test_time_of_retry_request_is_a_sort_key(
    client: TestClient, stored: list[FailedAttempt]
) -> None:
    ascending = ids(
        client.get("/api/errors", params={"sort": "time_of_retry_request", "direction": "asc"})
    )
    descending = ids(
        client.get("/api/errors", params={"sort": "time_of_retry_request", "direction": "desc"})
    )
    assert sorted(ascending) == sorted(a.unique_message_id for a in stored)
    assert descending == list(reversed(ascending))


@pytest.mark.parametrize("status", ["nosuchstatus", "", "-nosuchstatus"])
def test_an_unknown_status_is_no_filter(
    client: TestClient, stored: list[FailedAttempt], status: str
) -> None:
    answer = client.get("/api/errors", params={"status": status})
    assert sorted(ids(answer)) == sorted(a.unique_message_id for a in stored)


def test_known_statuses_still_filter_beside_an_unknown_one(
    client: TestClient, stored: list[FailedAttempt]
) -> None:
    answer = client.get("/api/errors", params={"status": "archived,nosuchstatus"})
    assert ids(answer) == [stored[0].unique_message_id]


def test_an_empty_queueaddress_is_no_filter(
    client: TestClient, stored: list[FailedAttempt]
) -> None:
    answer = client.get("/api/errors", params={"status": "unresolved", "queueaddress": ""})
    assert answer.headers["Total-Count"] == "2"
    assert sorted(ids(answer)) == sorted(a.unique_message_id for a in stored[1:])


@pytest.mark.parametrize("name", ["queueaddress", "queueAddress"])
@pytest.mark.parametrize("value", ["sales", "SALES", "Sales"])
def test_the_queue_address_matches_any_case_under_either_name(
    client: TestClient, stored: list[FailedAttempt], name: str, value: str
) -> None:
    answer = client.get("/api/errors", params={name: value})
    assert sorted(ids(answer)) == sorted(a.unique_message_id for a in stored[:2])


def test_the_group_errors_view_is_as_lenient(
    client: TestClient, stored: list[FailedAttempt]
) -> None:
    group_id = next(g.id for g in stored[0].groups)
    modified = "2000-01-01T00:00:00.000Z...2999-01-01T00:00:00.000Z"
    answer = client.get(
        f"/api/recoverability/groups/{group_id}/errors",
        params={
            "status": "archived",
            "page": 1,
            "per_page": 50,
            "sort": "",
            "direction": "desc",
            "modified": modified,
        },
    )
    assert ids(answer) == [stored[0].unique_message_id]
