"""The store-and-forward engine over a real tracking store (SQLite file), at a fixed clock."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from controlroom.exceptions import ConfigurationError
from controlroom.site import (
    CachedCallFailed,
    CommandOutcome,
    SiteAgent,
    SiteSettings,
    Status,
    lifecycle,
)
from controlroom.site.lifecycle import PermanentFailure
from controlroom.site.store import SCHEMA_VERSION, TrackingStore
from controlroom.telemetry.contract import validate_packet
from controlroom.telemetry.stamps import Stamp
from tests.site.http import FlakyTargets, serving

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class Target:
    """An operation that fails transiently ``fail_times`` times, or always permanently."""

    def __init__(self, fail_times: int = 0, permanent: bool = False) -> None:
        self.fail_times = fail_times
        self.permanent = permanent
        self.calls: list[object] = []

    def __call__(self, payload: object) -> None:
        self.calls.append(payload)
        if self.permanent:
            raise PermanentFailure("rejected", http_status=422)
        if len(self.calls) <= self.fail_times:
            raise ConnectionError("target unreachable")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def site_settings(tmp_path: Path) -> SiteSettings:
    return SiteSettings(
        site_id="plant-7", node="node-a", store_path=tmp_path / "tracking.db", max_retries=3
    )


@pytest.fixture
def agent(site_settings: SiteSettings, clock: Clock) -> Iterator[SiteAgent]:
    agent = SiteAgent(site_settings, clock=clock)
    try:
        yield agent
    finally:
        agent.close()


def packets(agent: SiteAgent) -> list[dict]:
    return [packet for _, packet in agent.store.pending_packets(10_000)]


def test_a_successful_call_is_delivered_with_one_packet_per_transition(agent: SiteAgent) -> None:
    target = Target()
    agent.register("post-invoice", target)
    result = agent.cached_call("erp/invoices", "post-invoice", {"number": 42})
    assert result.status is Status.DELIVERED
    assert target.calls == [{"number": 42}]
    sent = packets(agent)
    assert [p["status"] for p in sent] == ["Submitted", "Delivered"]
    assert {p["tracked_operation_id"] for p in sent} == {result.tracked_operation_id}
    events = [p["audit_event"] for p in sent]
    assert [e["action"] for e in events] == ["CachedCallSubmitted", "CachedCallDelivered"]
    assert all(e["correlation_id"] == result.tracked_operation_id for e in events)
    assert len({e["event_id"] for e in events}) == 2
    assert sent[0]["updated_at_utc"] < sent[1]["updated_at_utc"]  # strictly increasing stamps


def test_a_permanent_failure_is_failed_and_raised(agent: SiteAgent) -> None:
    agent.register("post-invoice", Target(permanent=True))
    with pytest.raises(CachedCallFailed) as raised:
        agent.cached_call("erp/invoices", "post-invoice", {})
    state = agent.store.state(raised.value.state.tracked_operation_id)
    assert state.status is Status.FAILED and state.terminal_at_utc is not None
    assert [p["status"] for p in packets(agent)] == ["Submitted", "Failed"]


def test_a_transient_failure_is_buffered_retried_with_backoff_and_parked(
    agent: SiteAgent, clock: Clock
) -> None:
    target = Target(fail_times=100)
    agent.register("post-invoice", target)
    result = agent.cached_call("erp/invoices", "post-invoice", {})
    assert result.status is Status.ATTEMPTED
    assert agent.attempt_due() == 0  # not due before its backoff
    clock.advance(1.1)
    assert agent.attempt_due() == 1
    assert agent.store.state(result.tracked_operation_id).retry_count == 2
    clock.advance(1)
    assert agent.attempt_due() == 0  # the second wait is 2 s
    clock.advance(1.1)
    assert agent.attempt_due() == 1
    state = agent.store.state(result.tracked_operation_id)
    assert (state.status, state.retry_count) == (Status.PARKED, 3)
    clock.advance(3600)
    assert agent.attempt_due() == 0  # Parked waits for an operator
    assert len(target.calls) == 3
    assert [p["status"] for p in packets(agent)] == [
        "Submitted",
        "Attempted",
        "Attempted",
        "Parked",
    ]


def test_buffered_calls_resume_after_a_restart(site_settings: SiteSettings, clock: Clock) -> None:
    first = SiteAgent(site_settings, clock=clock)
    first.register("post-invoice", Target(fail_times=100))
    buffered = first.cached_call("erp/invoices", "post-invoice", {"n": 1}).tracked_operation_id
    in_hand = first.cached_call("erp/invoices", "post-invoice", {"n": 2}).tracked_operation_id
    clock.advance(5)
    # The process dies while attempting the second call: its claim stays in the store.
    assert first.store.claim(first.store.state(in_hand), first.instance)
    first.close()

    second = SiteAgent(site_settings, clock=clock)
    try:
        target = Target()
        second.register("post-invoice", target)
        assert second.attempt_due() == 2
        assert sorted(p["n"] for p in target.calls) == [1, 2]
        assert second.store.state(buffered).status is Status.DELIVERED
        assert second.store.state(in_hand).status is Status.DELIVERED
    finally:
        second.close()


def test_one_process_owns_a_store(agent: SiteAgent, site_settings: SiteSettings) -> None:
    with pytest.raises(ConfigurationError, match="in use"):
        SiteAgent(site_settings)


def test_operator_retry_of_a_parked_call_starts_a_new_epoch_and_delivers(
    agent: SiteAgent, clock: Clock
) -> None:
    target = Target(fail_times=3)
    agent.register("post-invoice", target)
    call_id = agent.cached_call("erp/invoices", "post-invoice", {}).tracked_operation_id
    for _ in range(2):
        clock.advance(10)
        agent.attempt_due()
    assert agent.store.state(call_id).status is Status.PARKED
    assert agent.retry(call_id, "alice") is CommandOutcome.APPLIED
    state = agent.store.state(call_id)
    assert (state.status, state.epoch, state.retry_count) == (Status.SUBMITTED, 1, 0)
    assert agent.attempt_due() == 1
    state = agent.store.state(call_id)
    assert (state.status, state.epoch) == (Status.DELIVERED, 1)
    retried = [p for p in packets(agent) if p["audit_event"]["action"] == "CachedCallRetried"]
    assert [p["audit_event"]["actor"] for p in retried] == ["alice"]
    assert agent.retry(call_id, "alice") is CommandOutcome.NOT_PARKED
    assert agent.discard(call_id, "alice") is CommandOutcome.NOT_PARKED
    assert agent.discard(str(uuid.uuid4()), "alice") is CommandOutcome.NOT_FOUND


def test_discard_ends_a_parked_call(agent: SiteAgent, clock: Clock) -> None:
    agent.register("post-invoice", Target(fail_times=100))
    call_id = agent.cached_call("erp/invoices", "post-invoice", {}).tracked_operation_id
    assert agent.discard(call_id, "bob") is CommandOutcome.NOT_PARKED  # Attempted, not Parked
    for _ in range(2):
        clock.advance(10)
        agent.attempt_due()
    assert agent.store.state(call_id).status is Status.PARKED
    assert agent.discard(call_id, "bob") is CommandOutcome.APPLIED
    state = agent.store.state(call_id)
    assert state.status is Status.DISCARDED and state.terminal_at_utc is not None
    assert packets(agent)[-1]["audit_event"]["actor"] == "bob"


def test_the_store_pages_as_the_reference_rule(agent: SiteAgent, clock: Clock) -> None:
    agent.register("post-invoice", Target())
    for _ in range(7):
        agent.cached_call("erp/invoices", "post-invoice", {})
    # Force a burst sharing one stamp, as a legacy clock would; the others share T0's
    # microsecond (the clock stands still: 100 ns apart).
    with agent.store.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE tracked_operations SET updated_at_utc = '2026-03-01 12:00:00.000000', "
            "updated_at_tick = 0 WHERE rowid % 2 = 0"
        )
    states = agent.store.states()
    for since, after_id in [
        (None, None),
        (Stamp.of(T0), None),
        (Stamp.of(T0), states[0].tracked_operation_id),
        (Stamp(T0, 3), None),
        (Stamp(T0, 3), "0"),
        (Stamp.of(T0 + timedelta(microseconds=3)), "0"),
    ]:
        for limit in (1, 2, 3, 10):
            assert agent.store.changes(since, after_id, limit) == lifecycle.changes_after(
                states, since, after_id, limit
            ), (since, after_id, limit)


def test_every_packet_meets_centrals_contract(agent: SiteAgent, clock: Clock) -> None:
    agent.register("ok", Target())
    agent.register("rejected", Target(permanent=True))
    agent.register("down", Target(fail_times=100))
    agent.cached_call("erp/invoices", "ok", {})
    with pytest.raises(CachedCallFailed):
        agent.cached_call("erp/invoices", "rejected", {})
    parked = agent.cached_call("erp/invoices" * 18, "down", {}).tracked_operation_id
    for _ in range(2):
        clock.advance(10)
        agent.attempt_due()
    assert agent.retry(parked, "alice") is CommandOutcome.APPLIED
    for _ in range(3):  # the new epoch parks again
        agent.attempt_due()
        clock.advance(10)
    assert agent.discard(parked, "alice") is CommandOutcome.APPLIED
    sent = packets(agent)
    statuses = {p["status"] for p in sent}
    assert statuses == {"Submitted", "Attempted", "Parked", "Delivered", "Failed", "Discarded"}
    for packet in sent:
        validate_packet(json.loads(json.dumps(packet)))  # raises TelemetryRejected


def test_a_failed_packet_carries_the_whole_error(agent: SiteAgent) -> None:
    agent.register("post-invoice", Target(permanent=True))
    with pytest.raises(CachedCallFailed):
        agent.cached_call("erp/invoices", "post-invoice", {})
    failed = packets(agent)[-1]
    assert json.loads(failed["audit_event"]["details_json"])["error"].startswith("PermanentFailure")
    assert failed["http_status"] == 422 and failed["terminal_at_utc"] is not None


def test_a_function_can_be_the_operation(agent: SiteAgent) -> None:
    seen = []

    def post_invoice(payload: object) -> None:
        seen.append(payload)

    assert agent.cached_call("erp/invoices", post_invoice, {"n": 1}).status is Status.DELIVERED
    assert seen == [{"n": 1}]


def test_a_delivered_http_call_reports_the_delivering_answers_status(
    agent: SiteAgent, clock: Clock
) -> None:
    """Never the 503 of the attempt before (docs/decisions.md "A Delivered call's
    http_status is its delivering attempt's")."""
    targets = FlakyTargets()
    targets.fail_times["a"] = 1
    with serving(targets.app) as url:
        result = agent.http_call("POST", f"{url}/recovers/a", json={"n": 1})
        assert result.status is Status.ATTEMPTED
        assert agent.store.state(result.tracked_operation_id).http_status == 503
        clock.advance(1.1)
        assert agent.attempt_due() == 1
    state = agent.store.state(result.tracked_operation_id)
    assert (state.status, state.http_status, state.last_error) == (Status.DELIVERED, 200, None)
    delivered = packets(agent)[-1]
    assert (delivered["status"], delivered["http_status"]) == ("Delivered", 200)
    assert json.loads(delivered["audit_event"]["details_json"])["http_status"] == 200


def http_error(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "https://erp.example/invoices")
    response = httpx.Response(code, request=request)
    return httpx.HTTPStatusError(f"HTTP {code}", request=request, response=response)


@pytest.mark.parametrize(
    ("answer", "http_status"),
    [(None, None), (httpx.Response(201), 201), ("done", None)],
)
def test_a_delivered_operation_reports_the_status_of_the_response_it_returns(
    agent: SiteAgent, clock: Clock, answer: object, http_status: int | None
) -> None:
    """An operation that returns no ``httpx.Response`` leaves the status unknown: null,
    never the failed attempt's."""
    attempts = []

    def post_invoice(payload: object) -> object:
        attempts.append(payload)
        if len(attempts) == 1:
            raise http_error(503)
        return answer

    result = agent.cached_call("erp/invoices", post_invoice, {"n": 1})
    assert agent.store.state(result.tracked_operation_id).http_status == 503
    clock.advance(1.1)
    assert agent.attempt_due() == 1
    state = agent.store.state(result.tracked_operation_id)
    assert (state.status, state.http_status) == (Status.DELIVERED, http_status)
    assert packets(agent)[-1]["http_status"] == http_status


@pytest.mark.parametrize("operator", ["ali\x00ce", "\ud800", "o" * 257, ""])
def test_a_command_by_an_operator_central_would_refuse_is_not_applied(
    agent: SiteAgent, clock: Clock, operator: str
) -> None:
    # The operator is the audit event's actor: refused at central, its record would be lost.
    agent.register("post-invoice", Target(fail_times=100))
    call_id = agent.cached_call("erp/invoices", "post-invoice", {}).tracked_operation_id
    for _ in range(2):
        clock.advance(10)
        agent.attempt_due()
    for command in (agent.retry, agent.discard):
        with pytest.raises(ValueError, match="operator"):
            command(call_id, operator)
    assert agent.store.state(call_id).status is Status.PARKED


@pytest.mark.parametrize("target", ["erp\x00", "\udc00", "t" * 257, ""])
def test_a_target_central_would_refuse_is_refused_before_the_call(
    agent: SiteAgent, target: str
) -> None:
    agent.register("post-invoice", Target())
    with pytest.raises(ValueError, match="target"):
        agent.cached_call(target, "post-invoice", {})
    assert agent.store.states() == []


def test_a_store_of_schema_1_gains_the_100_ns_columns(site_settings: SiteSettings) -> None:
    store = TrackingStore.open(site_settings.store_path)
    with store.engine.begin() as conn:  # back to schema 1: microsecond stamps only
        conn.exec_driver_sql("DROP INDEX ix_tracked_operations_changes")
        for name in ("created_at", "updated_at", "terminal_at"):
            conn.exec_driver_sql(f"ALTER TABLE tracked_operations DROP COLUMN {name}_tick")
        conn.exec_driver_sql(
            "CREATE INDEX ix_tracked_operations_changes "
            "ON tracked_operations (updated_at_utc, tracked_operation_id)"
        )
        conn.exec_driver_sql(
            "INSERT INTO tracked_operations (tracked_operation_id, channel, target, "
            "source_site, status, retry_count, created_at_utc, updated_at_utc, epoch, "
            "operation, payload_json) VALUES ('old', 'DbOutbound', 'erp', 'plant-7', "
            "'Submitted', 0, '2026-03-01 12:00:00.000001', '2026-03-01 12:00:00.000001', 0, "
            "'op', 'null')"
        )
        conn.exec_driver_sql("PRAGMA user_version = 1")
    store.close()

    store = TrackingStore.open(site_settings.store_path)
    try:
        (old,) = store.states()
        assert old.updated_at_utc == Stamp.of(T0 + timedelta(microseconds=1))
        with store.transition(T0) as (_conn, stamp):  # the clock is behind the store
            assert stamp == Stamp(T0 + timedelta(microseconds=1), 1)
        assert store.changes(Stamp.of(T0), None, 10) == ([old], False)
    finally:
        store.close()


def test_a_store_of_schema_2_gains_its_notifications_and_keeps_its_calls(
    site_settings: SiteSettings,
) -> None:
    agent = SiteAgent(site_settings)
    agent.register("noop", lambda _payload: None)
    kept = agent.cached_call("erp/x", "noop", {}).tracked_operation_id
    with agent.store.engine.begin() as conn:  # back to schema 2: no notifications
        conn.exec_driver_sql("DROP TABLE site_notifications")
        conn.exec_driver_sql("PRAGMA user_version = 2")
    agent.close()

    agent = SiteAgent(site_settings)
    try:
        assert [state.tracked_operation_id for state in agent.store.states()] == [kept]
        sent = agent.notify("oncall", "Pump 3 stopped")
        assert agent.store.notification(sent)["status"] == "Pending"
        with agent.store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA user_version").scalar_one() == SCHEMA_VERSION
    finally:
        agent.close()


def test_a_store_of_schema_3_gains_the_recipients_and_keeps_its_notifications(
    site_settings: SiteSettings,
) -> None:
    agent = SiteAgent(site_settings)
    kept = agent.notify("oncall", "Pump 3 stopped")
    with agent.store.engine.begin() as conn:  # back to schema 3: no recipients
        conn.exec_driver_sql("ALTER TABLE site_notifications DROP COLUMN recipients")
        conn.exec_driver_sql("PRAGMA user_version = 3")
    agent.close()

    agent = SiteAgent(site_settings)
    try:
        assert agent.store.notification(kept)["recipients"] is None
        sent = agent.notify(None, "Pump 4 stopped", recipients=["ops@plant.example"])
        assert agent.store.notification(sent)["recipients"] == ["ops@plant.example"]
        with agent.store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA user_version").scalar_one() == SCHEMA_VERSION
    finally:
        agent.close()
