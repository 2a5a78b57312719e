"""ServiceControl's API contract, route by route, on every provider: the exact field names,
types, status strings and headers that ServicePulse and ServiceControl scripts read
(docs/decisions.md "ServiceControl's API contract is pinned route by route"). Other tests cover the
behaviour behind each route; these pin the shapes."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import AuthToken, Settings
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.grouping import EXCEPTION_TYPE_AND_STACK_TRACE
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.model import FailedAttempt
from controlroom.transport.embedded import EmbeddedQueue
from tests.factories import at
from tests.nsb import failed_headers
from tests.retries.conftest import make_processor, set_status, store_failed

ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,7})?Z$")
LOOKS_LIKE_A_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
DOTNET_TIMESPAN = re.compile(r"^-?(\d+\.)?\d{2}:\d{2}:\d{2}(\.\d{7})?$")

ENDPOINT_KEYS = {"name", "host_id", "host"}
EXCEPTION_KEYS = {"exception_type", "message", "source", "stack_trace"}
LIST_ITEM_KEYS = {
    "id",
    "message_id",
    "message_type",
    "time_sent",
    "is_system_message",
    "exception",
    "number_of_processing_attempts",
    "status",
    "sending_endpoint",
    "receiving_endpoint",
    "queue_address",
    "time_of_failure",
    "last_modified",
}
SEARCH_ITEM_KEYS = {
    "id",
    "message_id",
    "message_type",
    "conversation_id",
    "is_system_message",
    "status",
    "processed_at",
    "time_sent",
    "sending_endpoint",
    "receiving_endpoint",
    "body_url",
    "body_size",
    "headers",
    "processing_time",  # ServiceControl's timings: "00:00:00" for a failed message
    "critical_time",
    "delivery_time",
}
GROUP_KEYS = {
    "id",
    "title",
    "type",
    "count",
    "first",
    "last",
    "operation_status",
    "operation_progress",
    "need_user_acknowledgement",
    "failures_per_hour",  # Controlroom's own (ServicePulse ignores them)
    "growth",
}
IDLE = {"operation_status": "None", "operation_progress": 0.0, "need_user_acknowledgement": False}
HISTORIC_KEYS = {
    "request_id",
    "retry_type",
    "start_time",
    "completion_time",
    "originator",
    "failed",
    "number_of_messages_processed",
}
ORIGIN = "https://pulse.example.com:9090"


# --- helpers ------------------------------------------------------------------------------
def assert_service_control_json(value: Any, path: str = "$") -> None:
    """No null anywhere (ServiceControl leaves null fields out) and every time ISO 8601
    UTC with ``Z``, outside a message's ``headers``: those are data, kept as sent."""
    if value is None:
        raise AssertionError(f"{path} is null; null fields must be left out")
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "headers":
                continue
            assert_service_control_json(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            assert_service_control_json(item, f"{path}[{index}]")
    elif isinstance(value, str) and LOOKS_LIKE_A_TIME.match(value):
        assert ISO_UTC.match(value), f"{path} = {value!r} is not ISO 8601 UTC with Z"


def get_json(client: TestClient, url: str) -> Any:
    """GET ``url``: 200, JSON, ServiceControl's version header, ServiceControl's JSON."""
    response = client.get(url)
    assert response.status_code == 200, f"{url}: {response.status_code} {response.text}"
    assert response.headers["content-type"].startswith("application/json")
    assert response.headers["X-Particular-Version"] == "6.15.0"
    body = response.json()
    assert_service_control_json(body)
    return body


def assert_times(item: dict[str, Any], *keys: str) -> None:
    for key in keys:
        assert isinstance(item[key], str) and ISO_UTC.match(item[key]), (key, item.get(key))


def assert_list_item(item: dict[str, Any]) -> None:
    """ServiceControl's ``FailedMessageView`` with every field known (as in our fixture)."""
    assert set(item) == LIST_ITEM_KEYS
    assert all(isinstance(item[key], str) for key in ("id", "message_id", "message_type"))
    assert isinstance(item["queue_address"], str)
    assert isinstance(item["is_system_message"], bool)
    assert isinstance(item["number_of_processing_attempts"], int)
    assert item["status"] in {"unresolved", "resolved", "retryIssued", "archived"}
    assert set(item["exception"]) == EXCEPTION_KEYS
    assert set(item["sending_endpoint"]) <= ENDPOINT_KEYS and "name" in item["sending_endpoint"]
    assert set(item["receiving_endpoint"]) == ENDPOINT_KEYS
    assert_times(item, "time_sent", "time_of_failure", "last_modified")


def store(
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    message_id: str,
    **options: Any,
) -> FailedAttempt:
    return store_failed(settings, writer, body_store, failed_headers(message_id, **options))


def default_group(attempt: FailedAttempt) -> str:
    (group,) = (g for g in attempt.groups if g.classifier == EXCEPTION_TYPE_AND_STACK_TRACE)
    return group.id


@pytest.fixture
def stored(
    settings: Settings, writer: FailedMessageBatchWriter, body_store: FileSystemBodyStore
) -> list[FailedAttempt]:
    """Three Unresolved failed messages of one group, NServiceBus message ids (GUIDs)."""
    return [
        store(settings, writer, body_store, str(uuid.UUID(int=n + 1)), failed_at=at(n))
        for n in range(3)
    ]


# --- root, version header, license, configuration -----------------------------------------
@pytest.mark.parametrize("path", ["/api", "/api/"])
def test_root_lists_the_main_urls(client: TestClient, path: str) -> None:
    root = get_json(client, path)

    base = "http://testserver/api/"
    page = "{?page,per_page,direction,sort}"
    assert root == {
        "name": "Controlroom",
        "description": root["description"],
        "errors_url": f"{base}errors/{page}",
        "endpoints_error_url": f"{base}endpoints/{{name}}/errors/{page}",
        "endpoints_url": f"{base}endpoints",
        "known_endpoints_url": "/endpoints/known",
        "message_search_url": f"{base}messages/search/{{keyword}}/{page}",
        "archived_groups_url": f"{base}errors/groups/{{classifier?}}",
        "get_archive_group": f"{base}archive/groups/id/{{groupId}}",
        "configuration": f"{base}configuration",
        "license_status": "valid",
        "license_details": f"{base}license",
    }
    assert isinstance(root["description"], str) and root["description"]


def test_root_urls_answer(client: TestClient, stored: list[FailedAttempt]) -> None:
    root = get_json(client, "/api/")
    for key in ("errors_url", "endpoints_url", "configuration", "license_details"):
        url = root[key].removeprefix("http://testserver").split("{", 1)[0]
        assert client.get(url).status_code == 200, key
    assert client.get(f"/api{root['known_endpoints_url']}").status_code == 200


def test_every_api_answer_carries_the_version_header(
    tmp_path: Any, database_url: str, engine: sa.Engine
) -> None:
    token = "compat-reader-token-0123456789"
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        auth_tokens=[AuthToken(name="pulse", token=token, role="reader")],
        servicecontrol_api_version="6.9.1",
    )
    app = create_app(settings, engine, FileSystemBodyStore(tmp_path / "bodies"))
    authorized = {"Authorization": f"Bearer {token}"}
    with TestClient(app) as client:
        answers = [
            client.get("/api/", headers=authorized),  # 200
            client.get("/api/errors"),  # 401: no token
            client.patch("/api/errors/archive/", json=[], headers=authorized),  # 403
            client.get(f"/api/errors/last/{uuid.uuid4()}", headers=authorized),  # 404
            client.get("/api/errors/last/not-a-uuid", headers=authorized),  # 422
            client.get("/api/health"),  # open route
            client.get("/api/no/such/route", headers=authorized),  # 404 of the router
        ]
        outside = client.get("/openapi.json")
    assert [a.status_code for a in answers] == [200, 401, 403, 404, 422, 200, 404]
    for answer in answers:
        assert answer.headers["X-Particular-Version"] == "6.9.1", answer.request.url
    assert "X-Particular-Version" not in outside.headers  # not an /api answer


def test_version_setting_must_be_a_version() -> None:
    with pytest.raises(ValueError, match="servicecontrol_api_version"):
        Settings(servicecontrol_api_version="latest")


def test_license_says_there_is_none_in_service_controls_shape(client: TestClient) -> None:
    assert get_json(client, "/api/license") == {
        "trial_license": False,
        "edition": "Controlroom",
        "registered_to": "",
        "upgrade_protection_expiration": "",
        "expiration_date": "",
        "status": "valid",
        "license_type": "None: Controlroom needs no license",
        "instance_name": "Controlroom",
        "license_status": "Valid",
    }


def test_configuration_has_the_retention_period_as_a_dotnet_timespan(
    tmp_path: Any, database_url: str, engine: sa.Engine
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        error_retention_period=timedelta(days=10, hours=6),
    )
    with TestClient(create_app(settings, engine, FileSystemBodyStore(tmp_path))) as client:
        retention = get_json(client, "/api/configuration")["data_retention"]
    assert retention == {"error_retention_period": "10.06:00:00"}
    assert DOTNET_TIMESPAN.match(retention["error_retention_period"])


# --- failed messages ----------------------------------------------------------------------
def test_last_is_the_list_item_plus_edited_and_edit_of(
    client: TestClient, stored: list[FailedAttempt]
) -> None:
    first = stored[0]
    last = get_json(client, f"/api/errors/last/{first.unique_message_id}")

    assert set(last) == LIST_ITEM_KEYS | {"edited", "edit_of"}
    assert_list_item({key: last[key] for key in LIST_ITEM_KEYS})
    assert (last["id"], last["message_id"]) == (first.unique_message_id, first.message_id)
    assert (last["edited"], last["edit_of"]) == (False, "")
    assert last["status"] == "unresolved"
    listed = get_json(client, "/api/errors")
    assert {key: value for key, value in last.items() if key in LIST_ITEM_KEYS} in listed


def test_search_items_in_service_controls_message_shape(
    client: TestClient, stored: list[FailedAttempt], body_store: FileSystemBodyStore
) -> None:
    target = stored[1]
    response = client.get(f"/api/messages/search/{target.message_id}")
    assert response.headers["Total-Count"] == "1"
    (item,) = get_json(client, f"/api/messages/search/{target.message_id}")

    assert set(item) == SEARCH_ITEM_KEYS
    assert (item["id"], item["message_id"]) == (target.unique_message_id, target.message_id)
    assert item["message_type"] == "Shop.Messages.PlaceOrder"
    assert item["conversation_id"] == "be6afcc4-3295-4b6c-8d2f-b43b016c458b"
    assert item["status"] == "failed"
    assert_times(item, "processed_at", "time_sent")
    assert set(item["sending_endpoint"]) <= ENDPOINT_KEYS
    assert set(item["receiving_endpoint"]) == ENDPOINT_KEYS
    assert item["body_url"] == f"/messages/{target.unique_message_id}/body"
    assert isinstance(item["body_size"], int) and item["body_size"] == len(b"{}")
    assert all(set(header) <= {"key", "value"} and "key" in header for header in item["headers"])
    headers = {header["key"]: header.get("value") for header in item["headers"]}
    assert headers["NServiceBus.MessageId"] == target.message_id

    body = client.get(f"/api{item['body_url']}")  # body_url is relative to the API root
    assert body.status_code == 200 and body.content == b"{}"
    assert body.headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    ("status", "attempts", "expected"),
    [
        (FailedMessageStatus.UNRESOLVED, 1, "failed"),
        (FailedMessageStatus.UNRESOLVED, 2, "repeatedFailure"),
        (FailedMessageStatus.RESOLVED, 1, "resolvedSuccessfully"),
        (FailedMessageStatus.ARCHIVED, 2, "archivedFailure"),
        (FailedMessageStatus.RETRY_ISSUED, 1, "retryIssued"),
    ],
)
def test_search_status_strings(
    client: TestClient,
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    status: FailedMessageStatus,
    attempts: int,
    expected: str,
) -> None:
    message_id = str(uuid.uuid4())
    for n in range(attempts):
        attempt = store(settings, writer, body_store, message_id, failed_at=at(n))
    set_status(engine, attempt.unique_message_id, status)

    (item,) = get_json(client, f"/api/messages/search/{message_id}")

    assert item["status"] == expected


# --- groups, group operations, history ----------------------------------------------------
def test_groups_carry_the_operation_fields(client: TestClient, stored: list[FailedAttempt]) -> None:
    groups = get_json(client, f"/api/recoverability/groups/{EXCEPTION_TYPE_AND_STACK_TRACE}")
    (group,) = groups

    assert set(group) == GROUP_KEYS
    assert group["id"] == default_group(stored[0])
    assert group["type"] == EXCEPTION_TYPE_AND_STACK_TRACE
    assert group["count"] == 3
    assert_times(group, "first", "last")
    assert {key: group[key] for key in IDLE} == IDLE
    assert get_json(client, f"/api/recoverability/groups/id/{group['id']}") == group


def test_empty_classifier_is_the_default_classifier(
    client: TestClient, stored: list[FailedAttempt]
) -> None:
    default = get_json(client, f"/api/recoverability/groups/{EXCEPTION_TYPE_AND_STACK_TRACE}")
    response = client.get("/api/recoverability/groups/")
    assert response.headers["Total-Count"] == "1"
    assert get_json(client, "/api/recoverability/groups/") == default
    assert get_json(client, "/api/recoverability/groups") == default


def test_a_group_retry_shows_in_the_group_then_in_the_history_until_acknowledged(
    client: TestClient,
    settings: Settings,
    engine: sa.Engine,
    body_store: FileSystemBodyStore,
    stored: list[FailedAttempt],
) -> None:
    group_id = default_group(stored[0])
    retried = client.post(f"/api/recoverability/groups/{group_id}/errors/retry")
    assert retried.status_code == 202

    (running,) = get_json(client, "/api/recoverability/groups/")
    assert running["id"] == group_id and running["count"] == 0  # RetryIssued now
    assert running["operation_status"] in ("Preparing", "Forwarding")
    assert isinstance(running["operation_progress"], float)
    assert running["need_user_acknowledgement"] is False
    assert_times(running, "operation_start_time")
    assert get_json(client, "/api/recoverability/history")["unacknowledged_operations"] == []

    async def send_the_retry() -> None:
        async with EmbeddedQueue(settings.embedded_queue_path) as transport:
            processor = make_processor(settings, engine, transport, body_store)
            assert await processor.process_pending() == 1
            await processor.close()

    asyncio.run(send_the_retry())

    (completed,) = get_json(client, "/api/recoverability/groups/")
    assert completed["operation_status"] == "Completed"
    assert completed["operation_progress"] == 1.0
    assert completed["operation_remaining_count"] == 0
    assert completed["need_user_acknowledgement"] is True
    assert_times(completed, "operation_start_time", "operation_completion_time")
    history = get_json(client, "/api/recoverability/history")
    assert set(history) == {"historic_operations", "unacknowledged_operations"}
    (historic,) = history["historic_operations"]
    assert set(historic) == HISTORIC_KEYS
    assert (historic["retry_type"], historic["request_id"]) == ("FailureGroup", group_id)
    assert historic["number_of_messages_processed"] == 3 and historic["failed"] is False
    assert_times(historic, "start_time", "completion_time")
    (unacknowledged,) = history["unacknowledged_operations"]
    assert set(unacknowledged) == HISTORIC_KEYS | {"last", "classifier"}
    assert unacknowledged["classifier"] == EXCEPTION_TYPE_AND_STACK_TRACE

    acknowledged = client.delete(f"/api/recoverability/unacknowledgedgroups/{group_id}")

    assert acknowledged.status_code == 200
    assert get_json(client, "/api/recoverability/history")["unacknowledged_operations"] == []
    assert get_json(client, "/api/recoverability/groups/") == []  # its messages await confirmation


def test_retry_answers_leave_out_what_they_do_not_have(
    client: TestClient, stored: list[FailedAttempt]
) -> None:
    message = stored[0].unique_message_id
    first = client.post(f"/api/errors/{message}/retry")
    again = client.post(f"/api/errors/{message}/retry")  # claims nothing: no operation

    assert first.status_code == again.status_code == 202
    assert_service_control_json(first.json())
    assert_service_control_json(again.json())
    assert "operation_id" not in again.json()
    operation = get_json(client, f"/api/retries/{first.json()['operation_id']}")
    assert "completion_time" not in operation  # still running


# --- archive views ------------------------------------------------------------------------
def test_archive_with_a_trailing_slash_and_the_archived_views(
    client: TestClient, stored: list[FailedAttempt]
) -> None:
    ids = [attempt.unique_message_id for attempt in stored]
    group_id = default_group(stored[0])

    with_slash = client.patch("/api/errors/archive/", json=ids[:1])
    without = client.patch("/api/errors/archive", json=ids[1:2])

    assert with_slash.status_code == without.status_code == 202
    assert with_slash.json() == without.json() == {"changed": 1, "unchanged_ids": []}
    for message in ids[:2]:
        assert get_json(client, f"/api/errors/last/{message}")["status"] == "archived"
    archived = get_json(client, f"/api/errors/groups/{EXCEPTION_TYPE_AND_STACK_TRACE}")
    assert [(group["id"], group["count"]) for group in archived] == [(group_id, 2)]
    assert set(archived[0]) == GROUP_KEYS
    assert get_json(client, "/api/errors/groups/") == archived
    one = get_json(client, f"/api/archive/groups/id/{group_id}")
    assert one == archived[0]
    assert {key: one[key] for key in IDLE} == IDLE

    unarchived = client.patch("/api/errors/unarchive/", json=ids[:2])
    assert unarchived.status_code == 202 and unarchived.json()["changed"] == 2
    assert get_json(client, f"/api/errors/groups/{EXCEPTION_TYPE_AND_STACK_TRACE}") == []


# --- what Controlroom does not have -------------------------------------------------------
@pytest.mark.parametrize("path", ["/api/endpoints", "/api/customchecks", "/api/customchecks/"])
def test_empty_lists_where_controlroom_has_nothing_of_the_kind(
    client: TestClient, stored: list[FailedAttempt], path: str
) -> None:
    response = client.get(path)
    assert response.status_code == 200
    assert response.json() == []
    assert response.headers["Total-Count"] == "0"


def test_custom_checks_accept_service_controls_query(client: TestClient) -> None:
    response = client.get("/api/customchecks?status=fail&page=1&per_page=50")
    assert (response.status_code, response.json()) == (200, [])


# --- timestamps and nulls across the routes -----------------------------------------------
def test_every_read_route_writes_utc_times_with_z_and_leaves_nulls_out(
    client: TestClient,
    settings: Settings,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    stored: list[FailedAttempt],
) -> None:
    # A message with as little as NServiceBus may send: its absent values must be left out.
    headers = {
        key: value
        for key, value in failed_headers(str(uuid.uuid4()), failed_at=at(9)).items()
        if not key.startswith(("NServiceBus.Originating", "NServiceBus.TimeSent", "$.diag"))
    }
    sparse = store_failed(settings, writer, body_store, headers)
    group_id = default_group(stored[0])
    retried = client.post(f"/api/errors/{stored[2].unique_message_id}/retry").json()
    client.patch("/api/errors/archive", json=[stored[1].unique_message_id])

    paths = [
        "/api/",
        "/api/license",
        "/api/configuration",
        "/api/errors",
        "/api/errors/summary",
        "/api/errors/queues/addresses",
        f"/api/errors/last/{sparse.unique_message_id}",
        f"/api/errors/{sparse.unique_message_id}",
        f"/api/messages/search/{sparse.message_id}",
        "/api/messages/search?q=PlaceOrder",
        "/api/endpoints/Sales/errors",
        "/api/endpoints",
        "/api/endpoints/known",
        "/api/customchecks",
        "/api/recoverability/classifiers",
        "/api/recoverability/groups/",
        f"/api/recoverability/groups/id/{group_id}",
        f"/api/recoverability/groups/{group_id}/errors",
        "/api/recoverability/history",
        f"/api/retries/{retried['operation_id']}",
        "/api/errors/groups/",
        f"/api/archive/groups/id/{group_id}",
        "/api/edit/config",
    ]
    for path in paths:
        get_json(client, path)  # asserts the times and the nulls
    sparse_item = get_json(client, f"/api/errors/last/{sparse.unique_message_id}")
    assert "time_sent" not in sparse_item and "sending_endpoint" not in sparse_item


# --- CORS ---------------------------------------------------------------------------------
@pytest.fixture
def cors_client(
    settings: Settings, engine: sa.Engine, body_store: FileSystemBodyStore
) -> Iterator[TestClient]:
    allowed = settings.model_copy(update={"cors_allowed_origins": [ORIGIN]})
    with TestClient(create_app(allowed, engine, body_store)) as test_client:
        yield test_client


def preflight(client: TestClient, origin: str, method: str = "PATCH") -> Any:
    return client.options(
        "/api/errors/archive/",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": "Content-Type",
        },
    )


@pytest.mark.parametrize("method", ["GET", "POST", "PATCH", "DELETE", "PUT"])
def test_preflight_from_an_allowed_origin(cors_client: TestClient, method: str) -> None:
    response = preflight(cors_client, ORIGIN, method)

    assert response.status_code == 200
    assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
    allowed_methods = {
        m.strip() for m in response.headers["Access-Control-Allow-Methods"].split(",")
    }
    assert allowed_methods == {"GET", "POST", "PATCH", "DELETE", "PUT"}
    allowed_headers = response.headers["Access-Control-Allow-Headers"].lower()
    assert "content-type" in {h.strip() for h in allowed_headers.split(",")}
    assert response.headers["X-Particular-Version"] == "6.15.0"


def test_preflight_from_another_origin_is_refused(cors_client: TestClient) -> None:
    response = preflight(cors_client, "https://evil.example.com")

    assert response.status_code == 400
    assert "Access-Control-Allow-Origin" not in response.headers


def test_no_origin_is_allowed_by_default(client: TestClient) -> None:
    response = preflight(client, ORIGIN)

    assert response.status_code == 400
    assert "Access-Control-Allow-Origin" not in response.headers
    assert (
        "Access-Control-Allow-Origin" not in client.get("/api/", headers={"Origin": ORIGIN}).headers
    )


def test_answers_to_an_allowed_origin_expose_service_controls_headers(
    cors_client: TestClient, stored: list[FailedAttempt]
) -> None:
    response = cors_client.get("/api/errors?per_page=1", headers={"Origin": ORIGIN})

    assert response.status_code == 200
    assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
    exposed = {
        h.strip().lower() for h in response.headers["Access-Control-Expose-Headers"].split(",")
    }
    assert exposed == {
        "etag",
        "last-modified",
        "link",
        "total-count",
        "x-particular-version",
        "content-disposition",
    }
    other = cors_client.get("/api/errors", headers={"Origin": "https://evil.example.com"})
    assert "Access-Control-Allow-Origin" not in other.headers


@pytest.mark.parametrize("origin", ["https://pulse.example.com/", "pulse.example.com", "ftp://x"])
def test_an_origin_setting_that_no_browser_sends_is_refused(origin: str) -> None:
    with pytest.raises(ValueError, match="cors_allowed_origins"):
        Settings(cors_allowed_origins=[origin])
