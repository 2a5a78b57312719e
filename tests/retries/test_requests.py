"""Retry requests over HTTP on every provider: batches of at most 1,000, claims, RetryIssued,
404 for unknown ids and groups (one unknown id alone: 202, a no-op, as ServiceControl),
409 for archived and resolved messages (docs/decisions.md "Retry requests claim messages
in batches")."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.config import Settings
from controlroom.db.providers import provider_for
from controlroom.db.tables import (
    FailedMessageStatus,
    event_log_items,
    failed_message_groups,
    failed_messages,
    retry_batches,
    retry_operations,
)
from controlroom.db.transactions import begin_write
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.errors.ingest.grouping import EXCEPTION_TYPE_AND_STACK_TRACE
from controlroom.errors.ingest.writer import FailedMessageBatchWriter
from controlroom.errors.retries import processor as processor_module
from controlroom.errors.retries import requests as retries
from tests.nsb import failed_headers
from tests.retries.conftest import (
    batch_statuses,
    claims,
    set_status,
    statuses,
    store_failed,
    store_many,
)

RETRY_ISSUED = FailedMessageStatus.RETRY_ISSUED
UNRESOLVED = FailedMessageStatus.UNRESOLVED


def status_changed_at(engine: sa.Engine) -> dict[str, object]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(failed_messages.c.id, failed_messages.c.status_changed_at))
        return {row.id: row.status_changed_at for row in rows}


def test_retry_all_makes_batches_of_at_most_1000_and_marks_every_claimed_message(
    settings: Settings, engine: sa.Engine, writer: FailedMessageBatchWriter, client: TestClient
) -> None:
    ids = store_many(settings, writer, 2500)

    response = client.post("/api/errors/retry/all")

    assert response.status_code == 202, response.text
    answer = response.json()
    assert answer["retry_type"] == "All"
    assert [b["message_count"] for b in answer["batches"]] == [1000, 1000, 500]
    assert answer["message_count"] == 2500 and answer["skipped_count"] == 0
    assert set(statuses(engine).values()) == {RETRY_ISSUED}
    held = claims(engine)
    assert sorted(held) == ids
    assert {row.retry_batch_id for row in held.values()} == {b["id"] for b in answer["batches"]}
    assert batch_statuses(engine) == ["staging"] * 3
    operation = client.get(f"/api/retries/{answer['operation_id']}").json()
    assert operation["message_count"] == 2500 and operation["prepared_time"] is not None


def test_only_messages_claimed_by_this_request_change(
    settings: Settings, engine: sa.Engine, writer: FailedMessageBatchWriter, client: TestClient
) -> None:
    ids = store_many(settings, writer, 6)
    first = client.post("/api/errors/retry", json=ids[:3]).json()
    before = status_changed_at(engine)

    second = client.post("/api/errors/retry", json=ids)

    assert second.status_code == 202
    assert second.json()["message_count"] == 3 and second.json()["skipped_count"] == 3
    after = status_changed_at(engine)
    assert {i: after[i] for i in ids[:3]} == {i: before[i] for i in ids[:3]}  # untouched
    held = claims(engine)
    assert {held[i].retry_batch_id for i in ids[:3]} == {first["batches"][0]["id"]}
    assert {held[i].retry_batch_id for i in ids[3:]} == {second.json()["batches"][0]["id"]}


def test_retrying_what_is_already_in_a_retry_claims_nothing(
    settings: Settings, engine: sa.Engine, writer: FailedMessageBatchWriter, client: TestClient
) -> None:
    (message_id,) = store_many(settings, writer, 1)
    assert client.post(f"/api/errors/{message_id}/retry").json()["message_count"] == 1

    again = client.post(f"/api/errors/{message_id}/retry")

    assert again.status_code == 202
    # No operation: "operation_id" is left out (null fields are, as ServiceControl does).
    assert again.json() | {"request_id": None} == {
        "request_id": None,
        "retry_type": "SingleMessage",
        "message_count": 0,
        "skipped_count": 1,
        "batches": [],
    }
    assert len(batch_statuses(engine)) == 1


def test_group_retry_takes_exactly_the_groups_unresolved_messages(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    body_store: FileSystemBodyStore,
    client: TestClient,
) -> None:
    timeouts = [
        store_failed(
            settings,
            writer,
            body_store,
            failed_headers(f"t-{n}", exception_type="System.TimeoutException"),
        )
        for n in range(5)
    ]
    others = [
        store_failed(settings, writer, body_store, failed_headers(f"o-{n}")) for n in range(3)
    ]
    archived, resolved, in_retry = (t.unique_message_id for t in timeouts[:3])
    set_status(engine, archived, FailedMessageStatus.ARCHIVED)
    set_status(engine, resolved, FailedMessageStatus.RESOLVED)
    client.post(f"/api/errors/{in_retry}/retry")
    (group,) = (g for g in timeouts[0].groups if g.classifier == EXCEPTION_TYPE_AND_STACK_TRACE)

    response = client.post(f"/api/recoverability/groups/{group.id}/errors/retry")

    assert response.status_code == 202, response.text
    answer = response.json()
    assert answer["retry_type"] == "FailureGroup" and answer["request_id"] == group.id
    claimed = {
        i for i, c in claims(engine).items() if c.retry_batch_id == answer["batches"][0]["id"]
    }
    assert claimed == {t.unique_message_id for t in timeouts[3:]}
    now = statuses(engine)
    assert {now[o.unique_message_id] for o in others} == {UNRESOLVED}
    assert (now[archived], now[resolved]) == (
        FailedMessageStatus.ARCHIVED,
        FailedMessageStatus.RESOLVED,
    )


def test_queue_and_endpoint_retries_select_by_failed_queue_and_receiving_endpoint(
    settings: Settings, engine: sa.Engine, writer: FailedMessageBatchWriter, client: TestClient
) -> None:
    sales = store_many(settings, writer, 2, prefix="s", endpoint="Sales")
    billing = store_many(settings, writer, 3, prefix="b", endpoint="Billing")

    by_queue = client.post("/api/errors/queues/Sales/retry").json()
    by_endpoint = client.post("/api/errors/Billing/retry/all").json()

    assert (by_queue["retry_type"], by_queue["request_id"]) == ("ByQueueAddress", "Sales")
    assert (by_endpoint["retry_type"], by_endpoint["request_id"]) == ("AllForEndpoint", "Billing")
    held = claims(engine)
    assert {held[i].retry_batch_id for i in sales} == {by_queue["batches"][0]["id"]}
    assert {held[i].retry_batch_id for i in billing} == {by_endpoint["batches"][0]["id"]}


def test_a_queue_retry_takes_the_messages_its_list_shows_in_any_case(
    settings: Settings, engine: sa.Engine, writer: FailedMessageBatchWriter, client: TestClient
) -> None:
    upper = store_many(settings, writer, 2, prefix="u", endpoint="Sales")
    lower = store_many(settings, writer, 1, prefix="l", endpoint="sales")
    store_many(settings, writer, 1, prefix="o", endpoint="Billing")
    listed = client.get("/api/errors", params={"queueaddress": "SALES"}).json()
    assert sorted(m["id"] for m in listed) == sorted(upper + lower)

    answer = client.post("/api/errors/queues/SALES/retry").json()

    assert answer["message_count"] == 3, answer
    held = claims(engine)
    assert sorted(held) == sorted(upper + lower)
    operation = client.get(f"/api/retries/{answer['operation_id']}").json()
    assert operation["message_count"] == 3


def test_unknown_ids_and_groups_answer_404_naming_them(
    settings: Settings, engine: sa.Engine, writer: FailedMessageBatchWriter, client: TestClient
) -> None:
    known = store_many(settings, writer, 2)
    unknown = str(uuid.uuid4())

    single = client.post(f"/api/errors/{unknown}/retry")
    not_a_guid = client.post("/api/errors/not-a-guid/retry")
    selection = client.post("/api/errors/retry", json=[*known, unknown])
    group = client.post(f"/api/recoverability/groups/{unknown}/errors/retry")

    # One unknown id is accepted and does nothing, as ServiceControl accepts it.
    assert (single.status_code, not_a_guid.status_code) == (202, 202)
    assert single.json()["message_count"] == 0 and "operation_id" not in single.json()
    assert selection.status_code == 404 and unknown in selection.json()["detail"]
    assert group.status_code == 404 and unknown in group.json()["detail"]
    assert set(statuses(engine).values()) == {UNRESOLVED}  # nothing half done
    assert claims(engine) == {}


def test_archived_and_resolved_messages_answer_409_and_nothing_changes(
    settings: Settings, engine: sa.Engine, writer: FailedMessageBatchWriter, client: TestClient
) -> None:
    archived, resolved, fine = store_many(settings, writer, 3)
    set_status(engine, archived, FailedMessageStatus.ARCHIVED)
    set_status(engine, resolved, FailedMessageStatus.RESOLVED)

    single = client.post(f"/api/errors/{archived}/retry")
    selection = client.post("/api/errors/retry", json=[fine, resolved])

    assert single.status_code == 409
    assert f"{archived} is archived" in single.json()["detail"]
    assert "unarchive" in single.json()["detail"]
    assert selection.status_code == 409 and f"{resolved} is resolved" in selection.json()["detail"]
    # Breaker pass (fifth): a resolved one alone was told to unarchive it.
    assert "unarchive" not in selection.json()["detail"]
    assert "a resolved message has nothing left to retry" in selection.json()["detail"]
    assert statuses(engine)[fine] == UNRESOLVED and claims(engine) == {}


def test_empty_id_in_a_selection_answers_400(
    settings: Settings, engine: sa.Engine, client: TestClient
) -> None:
    response = client.post("/api/errors/retry", json=[""])
    assert response.status_code == 400 and "empty id" in response.json()["detail"]


def test_a_claim_left_by_a_done_batch_is_replaced_once_the_message_failed_again(
    settings: Settings, engine: sa.Engine, writer: FailedMessageBatchWriter
) -> None:
    (message_id,) = store_many(settings, writer, 1)
    first = retries.retry_message(engine, message_id)
    with engine.begin() as conn:  # as if sent, then failed again (the writer reopens it)
        conn.execute(sa.update(retry_batches).values(status="done"))
    set_status(engine, message_id, UNRESOLVED)

    again = retries.retry_message(engine, message_id)

    assert again.message_count == 1
    assert claims(engine)[message_id].retry_batch_id == again.batches[0].id != first.batches[0].id


def test_pending_retry_takes_over_the_claim_of_a_sent_but_unconfirmed_retry(
    settings: Settings, engine: sa.Engine, writer: FailedMessageBatchWriter, client: TestClient
) -> None:
    sent, in_flight = store_many(settings, writer, 2)
    client.post(f"/api/errors/{sent}/retry")
    with engine.begin() as conn:  # the first batch was sent; no confirmation came
        conn.execute(sa.update(retry_batches).values(status="done"))
    client.post(f"/api/errors/{in_flight}/retry")  # this one is still being sent

    plain = client.post("/api/errors/retry", json=[sent, in_flight]).json()
    pending = client.post("/api/pendingretries/retry", json=[sent, in_flight]).json()

    assert (plain["message_count"], plain["skipped_count"]) == (0, 2)
    assert (pending["message_count"], pending["skipped_count"]) == (1, 1)
    assert claims(engine)[sent].retry_batch_id == pending["batches"][0]["id"]
    assert statuses(engine) == {sent: RETRY_ISSUED, in_flight: RETRY_ISSUED}


def test_a_group_retry_asked_while_one_runs_starts_none_and_names_the_running_one(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    client: TestClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Breaker pass (sixth): four retries of one group of 15,000 asked at once made four
    operations of 4,000, 7,000, 1,000 and 3,000 messages, and the group showed the last
    (1,000). As ServiceControl's ``RetryAllInGroup`` does, a retry of a selection (a group,
    a queue, an endpoint, all) whose operation is still in progress starts none: the
    answer names the running operation, which takes every message. Driven step by step:
    the first request is held after it started its operation, before its first batch."""
    store_many(settings, writer, 30, exception_type="System.TimeoutException")
    with engine.connect() as conn:
        group_id = conn.execute(sa.select(failed_message_groups.c.group_id).limit(1)).scalar_one()
    started, go_on = threading.Event(), threading.Event()
    claim = retries._claim_batch

    def held_claim(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "first":
            started.set()
            assert go_on.wait(30)
        return claim(*args, **kwargs)

    monkeypatch.setattr(retries, "_claim_batch", held_claim)
    results: dict[str, retries.RetryRequestResult] = {}
    first = threading.Thread(
        target=lambda: results.update(first=retries.retry_group(engine, group_id)), name="first"
    )
    first.start()
    try:
        assert started.wait(30)
        second = retries.retry_group(engine, group_id)
    finally:
        go_on.set()
        first.join(30)

    assert second.already_running and second.batches == []
    answer = client.post(f"/api/recoverability/groups/{group_id}/errors/retry").json()
    assert answer["operation_id"] == results["first"].operation_id  # still running
    assert answer["message_count"] == 0 and answer["batches"] == []
    assert second.operation_id == results["first"].operation_id
    assert results["first"].message_count == 30
    with engine.connect() as conn:
        operations = conn.execute(sa.select(retry_operations.c.id)).scalars().all()
    assert operations == [results["first"].operation_id]


def test_a_retry_answers_once_its_time_is_up_and_creates_the_rest_of_its_batches_after(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fresh user, session 33: a group of 64,996 answered its 202 after 79 s (1.2 s a batch
    of 1,000 on a busy machine), past a proxy's usual 60 s; ServiceControl answers at once.
    A request given ``answer_within`` answers after the first batch created past that
    time, and goes on in the background; its operation is prepared when all are made."""
    monkeypatch.setattr(retries, "BATCH_SIZE", 10)
    ids = store_many(settings, writer, 25, exception_type="System.TimeoutException")
    with engine.connect() as conn:
        group_id = conn.execute(sa.select(failed_message_groups.c.group_id).limit(1)).scalar_one()
    woken = threading.Event()

    answer = retries.retry_group(engine, group_id, answer_within=0, on_batches=woken.set)

    assert answer.preparing and answer.message_count == 10  # the first batch only
    assert wait_prepared(engine, answer.operation_id) == 25
    assert woken.wait(5)  # the processor is told of the batches made after the answer
    assert statuses(engine) == dict.fromkeys(ids, RETRY_ISSUED)


def test_the_api_answers_a_large_selection_while_it_is_preparing(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    client: TestClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(retries, "BATCH_SIZE", 10)
    monkeypatch.setattr(retries, "ANSWER_WITHIN", 0.0)
    store_many(settings, writer, 25, endpoint="Sales")

    answer = client.post("/api/errors/Sales/retry/all")

    assert answer.status_code == 202
    body = answer.json()
    assert body["preparing"] is True and body["message_count"] == 10
    assert wait_prepared(engine, body["operation_id"]) == 25


def wait_prepared(engine: sa.Engine, operation_id: str) -> int:
    """The operation's message count once it is prepared (within 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        with engine.connect() as conn:
            operation = retries.get_operation(conn, operation_id)
        assert operation is not None
        if operation.prepared_at is not None:
            return operation.message_count
        assert time.monotonic() < deadline, "the rest of the batches were never made"
        time.sleep(0.05)


def test_a_group_retry_after_a_preparation_that_died_starts_anew_and_closes_the_dead_one(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Breaker, session 33: serve killed while a group's retry was creating its batches left
    its operation unprepared; for 10 minutes every retry of the group answered 202 naming
    that dead operation, with 0 messages, and the console showed it "Preparing". A request
    that made no progress for ``ABANDONED_PREPARATION`` is not running: the next request
    closes it with what it has and starts its own."""
    store_many(settings, writer, 3, exception_type="System.TimeoutException")
    with engine.connect() as conn:
        group_id = conn.execute(sa.select(failed_message_groups.c.group_id).limit(1)).scalar_one()
    claim = retries._claim_batch

    def died(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt  # the request's process ends before its first batch

    monkeypatch.setattr(retries, "_claim_batch", died)
    stopped_at = datetime.now(UTC) - retries.ABANDONED_PREPARATION - timedelta(seconds=1)
    with pytest.raises(KeyboardInterrupt):
        retries.retry_group(engine, group_id, clock=lambda: stopped_at)
    monkeypatch.setattr(retries, "_claim_batch", claim)

    again = retries.retry_group(engine, group_id)

    assert not again.already_running and again.message_count == 3
    with engine.connect() as conn:
        operations = conn.execute(sa.select(retry_operations.c.id)).scalars().all()
    # The dead one claimed nothing: not kept, as a request that claims nothing is not
    # (breaker, session 33: it was shown as "Retry sent: 0 of 0").
    assert operations == [again.operation_id]


def test_a_request_whose_operation_was_closed_meanwhile_stops_and_is_logged_once(
    settings: Settings,
    engine: sa.Engine,
    writer: FailedMessageBatchWriter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Breaker, session 33: a request held on a lock past ``ABANDONED_PREPARATION`` had its
    operation closed under it, went on making batches for the closed operation, prepared
    it again and logged its request a second time; the completed operation said 4,000
    sent where 6,000 were. Driven step by step: the background's first batch is held
    while the operation is closed."""
    monkeypatch.setattr(retries, "BATCH_SIZE", 10)
    store_many(settings, writer, 25, exception_type="System.TimeoutException")
    with engine.connect() as conn:
        group_id = conn.execute(sa.select(failed_message_groups.c.group_id).limit(1)).scalar_one()
    claim, calls = retries._claim_batch, []
    held, go_on = threading.Event(), threading.Event()

    def held_claim(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) == 2:  # the first batch after the answer waits on a lock
            held.set()
            assert go_on.wait(30)
        return claim(*args, **kwargs)

    monkeypatch.setattr(retries, "_claim_batch", held_claim)
    answer = retries.retry_group(engine, group_id, answer_within=0)
    assert answer.preparing and held.wait(30)
    closed_at = datetime.now(UTC) + retries.ABANDONED_PREPARATION + timedelta(seconds=1)
    with begin_write(engine) as conn:
        retries.close_abandoned_preparations(conn, closed_at)
    go_on.set()
    for thread in threading.enumerate():
        if thread.name.startswith("retry-preparation-"):
            thread.join(30)

    with engine.connect() as conn:
        operation = conn.execute(sa.select(retry_operations)).one()
        batches = conn.execute(sa.select(sa.func.count()).select_from(retry_batches)).scalar()
        requested = conn.execute(
            sa.select(event_log_items.c.description).where(
                event_log_items.c.event_type == "RetryOperationRequested"
            )
        ).scalars().all()
    assert (operation.message_count, batches) == (10, 1)  # nothing claimed after the close
    assert operation.prepared_at == closed_at
    assert [text.endswith("before it claimed every message") for text in requested] == [True]


def test_forwarding_leaves_a_preparing_operations_progress_to_its_request(
    settings: Settings, engine: sa.Engine, writer: FailedMessageBatchWriter
) -> None:
    """Breaker, session 33: forwarding the batches of a request that had died kept its
    operation's ``last_modified`` moving, so it was taken for alive until every batch was
    sent, plus the minute: two minutes after a kill, retries of the group still named
    it."""
    store_many(settings, writer, 3, endpoint="Q")
    operation_id = retries.retry_all(engine).operation_id
    long_ago = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    with engine.begin() as conn:  # as if its request were still making batches
        conn.execute(sa.update(retry_operations).values(prepared_at=None, last_modified=long_ago))
    with begin_write(engine) as conn:
        processor_module._count(conn, operation_id, datetime.now(UTC), forwarded=3)
    with engine.connect() as conn:
        operation = conn.execute(sa.select(retry_operations)).one()
    assert (operation.forwarded_count, operation.last_modified) == (3, long_ago)


def test_a_retry_request_is_logged_when_it_was_made(
    settings: Settings, engine: sa.Engine, writer: FailedMessageBatchWriter
) -> None:
    """Fresh user, session 33: "RetryOperationRequested" was stamped when the request had
    made its last batch, 91 s after it was made and after half its batches were sent."""
    store_many(settings, writer, 3, exception_type="System.TimeoutException")
    with engine.connect() as conn:
        group_id = conn.execute(sa.select(failed_message_groups.c.group_id).limit(1)).scalar_one()
    ticks = iter(datetime(2026, 12, 7, 18, 50, n, tzinfo=UTC) for n in range(60))

    retries.retry_group(engine, group_id, clock=lambda: next(ticks))

    with engine.connect() as conn:
        started = conn.execute(sa.select(retry_operations.c.started_at)).scalar_one()
        raised = conn.execute(
            sa.select(event_log_items.c.raised_at).where(
                event_log_items.c.event_type == "RetryOperationRequested"
            )
        ).scalar_one()
    assert raised == started == datetime(2026, 12, 7, 18, 50, 0, tzinfo=UTC)


@pytest.mark.postgresql
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_two_group_retries_starting_at_once_wait_for_each_other(
    settings: Settings, engine: sa.Engine, writer: FailedMessageBatchWriter
) -> None:
    """PostgreSQL's writers run side by side (SQLite's are serialized by BEGIN
    IMMEDIATE): the second request's start waits on the selection's lock until the
    first's operation commits, then finds it running. Step by step: the first start's
    transaction is held open until the second is seen waiting in ``pg_locks``."""
    store_many(settings, writer, 5, exception_type="System.TimeoutException")
    with engine.connect() as conn:
        group_id = conn.execute(sa.select(failed_message_groups.c.group_id).limit(1)).scalar_one()
    results: dict[str, retries.RetryRequestResult] = {}
    with begin_write(engine) as held:
        provider_for(held).lock_retry_selection(held, f"FailureGroup:{group_id}")
        held.execute(
            sa.insert(retry_operations).values(
                id="held", retry_type="FailureGroup", target=group_id, message_count=0,
                forwarded_count=0, skipped_count=0, failed=False, acknowledged=False,
                started_at=datetime.now(UTC), last_modified=datetime.now(UTC),
            )
        )  # fmt: skip
        second = threading.Thread(
            target=lambda: results.update(second=retries.retry_group(engine, group_id))
        )
        second.start()
        waiting = sa.text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        )
        with engine.connect() as watcher:
            for _ in range(300):
                if watcher.execute(waiting).scalar_one():
                    break
                watcher.rollback()
                time.sleep(0.1)
            else:
                pytest.fail("the second request never waited for the first")
    second.join(30)
    assert results["second"].already_running and results["second"].operation_id == "held"
