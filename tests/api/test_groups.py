"""Failure groups on every provider: classifiers, group aggregates against a computation
in Python, a group's messages, comments, group archive, and the ServiceControl shape."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.db.tables import FailedMessageStatus, failed_messages
from controlroom.errors.ingest.grouping import (
    CLASSIFIERS,
    EXCEPTION_TYPE_AND_PYTHON_FRAME,
    EXCEPTION_TYPE_AND_STACK_TRACE,
    PYTHON_TASK_QUEUE,
    SERVICECONTROL_CLASSIFIERS,
)
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.errors.ingest.writer import FailedMessageBatchWriter, IngestionBatch
from controlroom.errors.model import FailedAttempt
from tests.api.failure_fixture import TIMEOUT, ExpectedGroup, expected_groups, ingest_fixture
from tests.api.failure_fixture import parse_utc as utc
from tests.python_tasks import HTTP_ERROR, celery_failure, dramatiq_failure

CLASSIFIER_NAMES = [classifier.name for classifier in CLASSIFIERS]
UNKNOWN_GROUP = "00000000-0000-4000-8000-000000000000"
GROUP_FIELDS = {
    "id",
    "title",
    "type",
    "count",
    "first",
    "last",
    "operation_status",
    "operation_progress",
    "need_user_acknowledgement",
    # Controlroom's own (ServicePulse ignores them): failures per hour, growth.
    "failures_per_hour",
    "growth",
}

Attempts = dict[str, list[FailedAttempt]]


@pytest.fixture
def attempts(writer: FailedMessageBatchWriter) -> Attempts:
    return ingest_fixture(writer)


def groups_of(client: TestClient, classifier: str, path: str = "recoverability/groups") -> Any:
    response = client.get(f"/api/{path}/{classifier}")
    assert response.status_code == 200, response.text
    return response.json()


def assert_groups_match(actual: list[dict[str, Any]], expected: dict[str, ExpectedGroup]) -> None:
    assert {group["id"]: group["count"] for group in actual} == {
        group_id: group.count for group_id, group in expected.items()
    }
    for group in actual:
        want = expected[group["id"]]
        assert (group["title"], group["type"]) == (want.title, want.classifier)
        assert (utc(group["first"]), utc(group["last"])) == (want.first, want.last)
    lasts = [utc(group["last"]) for group in actual]
    assert lasts == sorted(lasts, reverse=True), "latest failure first"


def archive(client: TestClient, *ids: str) -> None:
    response = client.patch("/api/errors/archive", json=list(ids))
    assert response.status_code == 202, response.text


def timeout_group(attempts: Attempts) -> ExpectedGroup:
    groups = expected_groups(attempts, EXCEPTION_TYPE_AND_STACK_TRACE, attempts)
    return next(group for group in groups.values() if group.title.startswith(TIMEOUT))


def group_id_of(attempts: Attempts, group: ExpectedGroup) -> str:
    groups = expected_groups(attempts, group.classifier, attempts)
    return next(gid for gid, found in groups.items() if found.title == group.title)


# --- classifiers and groups ---------------------------------------------------------------
def test_classifiers_are_servicecontrols_five_then_the_python_ones(client: TestClient) -> None:
    response = client.get("/api/recoverability/classifiers")
    assert response.status_code == 200
    assert response.json() == CLASSIFIER_NAMES
    assert response.json()[0] == EXCEPTION_TYPE_AND_STACK_TRACE
    assert response.json()[5:] == [EXCEPTION_TYPE_AND_PYTHON_FRAME, PYTHON_TASK_QUEUE]
    assert response.headers["Total-Count"] == "7"


# The NServiceBus fixture has no Python traceback: the Python classifier is tested below.
@pytest.mark.parametrize("classifier", [c.name for c in SERVICECONTROL_CLASSIFIERS])
def test_groups_match_a_direct_computation(
    client: TestClient, attempts: Attempts, classifier: str
) -> None:
    expected = expected_groups(attempts, classifier, attempts)
    assert expected, "the fixture gives every classifier at least one group"
    actual = groups_of(client, classifier)
    assert_groups_match(actual, expected)


def test_python_tasks_are_grouped_by_their_application_frame(
    client: TestClient, writer: FailedMessageBatchWriter
) -> None:
    # One bug on two hosts with different install paths and call depths, and another bug.
    failures = [
        celery_failure("task-1", host="pod-7f9c"),
        celery_failure("task-2", host="ci-3", trace="celery_http_error_other_host.txt"),
        dramatiq_failure("task-3"),
    ]
    batch = [
        parse_failed_message(headers, body, max_body_size_to_store=102_400)
        for headers, body in failures
    ]
    writer.write(IngestionBatch(attempts=batch, endpoints=[e for a in batch for e in a.endpoints]))
    found = {
        group["title"]: group["count"]
        for group in groups_of(client, EXCEPTION_TYPE_AND_PYTHON_FRAME)
    }
    assert found == {
        f"{HTTP_ERROR}: shop/payments.py in charge": 2,
        "json.decoder.JSONDecodeError: reports/storage.py in load_rows": 1,
    }


def test_a_message_belongs_to_its_newest_attempts_groups(
    client: TestClient, attempts: Attempts
) -> None:
    # order-8 failed first with ArgumentException, then with TimeoutException.
    titles = {group["title"].split(":")[0]: group for group in groups_of(client, "")}
    assert titles[TIMEOUT]["count"] == 4
    assert titles["System.ArgumentException"]["count"] == 1


@pytest.mark.parametrize("path", ["/api/recoverability/groups", "/api/recoverability/groups/"])
def test_no_classifier_means_the_default(client: TestClient, attempts: Attempts, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    assert response.json() == groups_of(client, EXCEPTION_TYPE_AND_STACK_TRACE)
    assert response.headers["Total-Count"] == str(len(response.json()))


def test_unknown_classifier_is_404_naming_the_classifiers(client: TestClient) -> None:
    response = client.get("/api/recoverability/groups/Nonsense")
    assert response.status_code == 404
    assert EXCEPTION_TYPE_AND_STACK_TRACE in response.json()["detail"]


def test_classifier_filter_keeps_the_group_with_that_title(
    client: TestClient, attempts: Attempts
) -> None:
    title = timeout_group(attempts).title
    response = client.get(
        f"/api/recoverability/groups/{EXCEPTION_TYPE_AND_STACK_TRACE}",
        params={"classifierFilter": title},
    )
    assert [group["title"] for group in response.json()] == [title]
    unfiltered = client.get("/api/recoverability/groups", params={"classifierFilter": "undefined"})
    assert len(unfiltered.json()) == 3


def test_group_shape_is_servicecontrols_with_nulls_omitted(
    client: TestClient, attempts: Attempts
) -> None:
    for group in groups_of(client, EXCEPTION_TYPE_AND_STACK_TRACE):
        assert set(group) == GROUP_FIELDS  # no comment yet: omitted, not null
        assert group["operation_status"] == "None"
        assert group["operation_progress"] == 0.0
        assert group["need_user_acknowledgement"] is False
        assert isinstance(group["count"], int)
        uuid.UUID(group["id"])


# --- counting only Unresolved -------------------------------------------------------------
def test_archiving_one_message_lowers_its_groups_count(
    client: TestClient, attempts: Attempts
) -> None:
    group = timeout_group(attempts)
    victim = sorted(group.members)[0]
    archive(client, victim)

    remaining = set(attempts) - {victim}
    for classifier in CLASSIFIER_NAMES:
        assert_groups_match(
            groups_of(client, classifier), expected_groups(attempts, classifier, remaining)
        )
    by_id = client.get(f"/api/recoverability/groups/id/{group_id_of(attempts, group)}").json()
    assert by_id["count"] == group.count - 1


def test_a_group_with_no_unresolved_message_leaves_the_list(
    client: TestClient, attempts: Attempts
) -> None:
    group = timeout_group(attempts)
    group_id = group_id_of(attempts, group)
    archive(client, *group.members)

    listed = {found["id"] for found in groups_of(client, EXCEPTION_TYPE_AND_STACK_TRACE)}
    assert group_id not in listed
    by_id = client.get(f"/api/recoverability/groups/id/{group_id}")
    assert by_id.status_code == 200
    assert by_id.json()["count"] == 0
    # ServiceControl has no such case (its view holds only groups with messages in the
    # status, and a view's First and Last are never empty): the keys stay, null.
    assert by_id.json()["first"] is None and by_id.json()["last"] is None
    archived = client.get(f"/api/archive/groups/id/{group_id}").json()
    assert archived["count"] == group.count and archived["first"] is not None
    unarchive_all = client.patch("/api/errors/unarchive", json=sorted(group.members))
    assert unarchive_all.status_code == 202
    archived = client.get(f"/api/archive/groups/id/{group_id}").json()
    assert archived["count"] == 0
    assert archived["first"] is None and archived["last"] is None


def test_other_statuses_are_not_counted(
    client: TestClient, engine: sa.Engine, attempts: Attempts
) -> None:
    group = timeout_group(attempts)
    resolved, retried = sorted(group.members)[:2]
    with engine.begin() as conn:
        for unique_id, status in (
            (resolved, FailedMessageStatus.RESOLVED),
            (retried, FailedMessageStatus.RETRY_ISSUED),
        ):
            conn.execute(
                sa.update(failed_messages)
                .where(failed_messages.c.id == unique_id)
                .values(status=int(status))
            )
    remaining = set(attempts) - {resolved, retried}
    assert_groups_match(
        groups_of(client, EXCEPTION_TYPE_AND_STACK_TRACE),
        expected_groups(attempts, EXCEPTION_TYPE_AND_STACK_TRACE, remaining),
    )


# --- one group ----------------------------------------------------------------------------
def test_group_by_id_matches_the_list(client: TestClient, attempts: Attempts) -> None:
    for group in groups_of(client, "Endpoint Name"):
        response = client.get(f"/api/recoverability/groups/id/{group['id']}")
        assert response.status_code == 200
        assert response.json() == group


def test_group_by_id_unknown_is_404_and_non_uuid_422(client: TestClient) -> None:
    assert client.get(f"/api/recoverability/groups/id/{UNKNOWN_GROUP}").status_code == 404
    response = client.get("/api/recoverability/groups/id/not-a-uuid")
    assert response.status_code == 422
    assert "groupId" in response.text


# --- a group's messages -------------------------------------------------------------------
def test_group_errors_are_its_members_paged(client: TestClient, attempts: Attempts) -> None:
    group = timeout_group(attempts)
    group_id = group_id_of(attempts, group)
    archive(client, sorted(group.members)[0])  # the list holds every status

    first = client.get(f"/api/recoverability/groups/{group_id}/errors", params={"per_page": 3})
    assert first.status_code == 200
    assert first.headers["Total-Count"] == str(group.count)
    assert 'rel="next"' in first.headers["Link"]
    assert f"recoverability/groups/{group_id}/errors?" in first.headers["Link"]
    second = client.get(
        f"/api/recoverability/groups/{group_id}/errors", params={"per_page": 3, "page": 2}
    )
    items = first.json() + second.json()
    assert {item["id"] for item in items} == group.members
    assert len(items) == group.count
    statuses = sorted(item["status"] for item in items)
    assert statuses == ["archived"] + ["unresolved"] * (group.count - 1)
    assert all(item["time_of_failure"].endswith("Z") for item in items)
    assert all(None not in item.values() for item in items)


def test_group_errors_take_the_lists_status_sort_and_head(
    client: TestClient, attempts: Attempts
) -> None:
    group = timeout_group(attempts)
    group_id = group_id_of(attempts, group)
    victim = sorted(group.members)[0]
    archive(client, victim)
    url = f"/api/recoverability/groups/{group_id}/errors"

    unresolved = client.get(url, params={"status": "unresolved"})
    assert unresolved.headers["Total-Count"] == str(group.count - 1)
    assert victim not in {item["id"] for item in unresolved.json()}
    assert client.get(url, params={"status": "-unresolved"}).headers["Total-Count"] == "1"

    by_failure = client.get(url, params={"sort": "time_of_failure", "direction": "asc"}).json()
    failures = [utc(item["time_of_failure"]) for item in by_failure]
    assert failures == sorted(failures)
    assert client.get(url, params={"sort": "nonsense"}).status_code == 200  # the default sort

    head = client.head(url, params={"per_page": 1})
    assert head.status_code == 200
    assert head.headers["Total-Count"] == str(group.count)
    assert head.content == b""


def test_group_errors_of_an_unknown_group_is_404(client: TestClient) -> None:
    assert client.get(f"/api/recoverability/groups/{UNKNOWN_GROUP}/errors").status_code == 404


# --- comments -----------------------------------------------------------------------------
def test_comment_set_replace_and_delete(client: TestClient, attempts: Attempts) -> None:
    group_id = group_id_of(attempts, timeout_group(attempts))
    url = f"/api/recoverability/groups/{group_id}/comment"

    assert client.post(url, params={"comment": "Vendor API down"}).status_code == 202
    assert client.get(f"/api/recoverability/groups/id/{group_id}").json()["comment"] == (
        "Vendor API down"
    )
    assert client.post(url, json={"comment": "Fixed in 2.1"}).status_code == 202
    listed = {group["id"]: group for group in groups_of(client, EXCEPTION_TYPE_AND_STACK_TRACE)}
    assert listed[group_id]["comment"] == "Fixed in 2.1"

    assert client.delete(url).status_code == 202
    assert "comment" not in client.get(f"/api/recoverability/groups/id/{group_id}").json()
    assert client.delete(url).status_code == 202  # deleting no comment is fine
    # ... and records nothing (breaker pass, second: a GroupCommentDeleted for no comment)
    events = [e["event_type"] for e in client.get("/api/eventlogitems").json()]
    assert events.count("GroupCommentDeleted") == 1


def test_comment_needs_a_known_group_and_a_comment(client: TestClient, attempts: Attempts) -> None:
    unknown = f"/api/recoverability/groups/{UNKNOWN_GROUP}/comment"
    assert client.post(unknown, params={"comment": "x"}).status_code == 404
    assert client.delete(unknown).status_code == 404
    group_id = group_id_of(attempts, timeout_group(attempts))
    response = client.post(f"/api/recoverability/groups/{group_id}/comment")
    assert response.status_code == 422
    assert "comment" in response.text


# --- group archive ------------------------------------------------------------------------
def test_group_archive_and_unarchive(client: TestClient, attempts: Attempts) -> None:
    group = timeout_group(attempts)
    group_id = group_id_of(attempts, group)
    archive(client, sorted(group.members)[0])

    response = client.post(f"/api/recoverability/groups/{group_id}/errors/archive")
    assert response.status_code == 202
    assert response.json() == {"changed": group.count - 1}
    assert group_id not in {g["id"] for g in groups_of(client, EXCEPTION_TYPE_AND_STACK_TRACE)}
    archived = client.get(f"/api/archive/groups/id/{group_id}").json()
    assert archived["count"] == group.count
    assert (utc(archived["first"]), utc(archived["last"])) == (group.first, group.last)
    archived_list = groups_of(client, EXCEPTION_TYPE_AND_STACK_TRACE, path="errors/groups")
    assert [g["id"] for g in archived_list] == [group_id]

    response = client.post(f"/api/recoverability/groups/{group_id}/errors/unarchive")
    assert response.json() == {"changed": group.count}
    assert_groups_match(
        groups_of(client, EXCEPTION_TYPE_AND_STACK_TRACE),
        expected_groups(attempts, EXCEPTION_TYPE_AND_STACK_TRACE, attempts),
    )
    assert client.get("/api/errors/groups").json() == []


@pytest.mark.parametrize("action", ["archive", "unarchive"])
def test_group_action_on_an_unknown_group_is_404(client: TestClient, action: str) -> None:
    response = client.post(f"/api/recoverability/groups/{UNKNOWN_GROUP}/errors/{action}")
    assert response.status_code == 404


def test_archived_views_of_the_default_classifier(client: TestClient, attempts: Attempts) -> None:
    group = timeout_group(attempts)
    archive(client, *sorted(group.members)[:2])
    for path in ("/api/errors/groups", "/api/errors/groups/"):
        listed = client.get(path)
        assert listed.status_code == 200
        assert [(g["title"], g["count"]) for g in listed.json()] == [(group.title, 2)]
    assert client.get("/api/errors/groups/Nonsense").status_code == 404
    assert client.get(f"/api/archive/groups/id/{UNKNOWN_GROUP}").status_code == 404
