"""The retry wire contract (pure): stripped and added headers, destinations, locked
headers, the confirmation message; and the claim SQL each provider compiles."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.dialects import postgresql, sqlite

from controlroom.client import confirm_successful_retry
from controlroom.db.providers import provider_for
from controlroom.errors.ingest.headers import parse_nsb_time
from controlroom.errors.ingest.parsing import is_retry_confirmation
from controlroom.errors.retries import wire as retry_wire
from controlroom.errors.retries.claims import claim_statement
from controlroom.transport.embedded import EmbeddedQueue
from tests.retries.conftest import take
from tests.transport.helpers import Collector


def test_retry_headers_strip_failure_headers_by_prefix_and_add_the_two_retry_headers() -> None:
    stored = {
        "NServiceBus.MessageId": "m-1",
        "NServiceBus.Retries": "3",
        "NServiceBus.Retries.Timestamp": "2026-01-01 00:00:00:000000 Z",
        "NServiceBus.FailedQ": "Sales@HOST",
        "NServiceBus.TimeOfFailure": "2026-01-01 00:00:00:000000 Z",
        "NServiceBus.ExceptionInfo.Message": "boom",
        "NServiceBus.ExceptionInfo.HelpLink": None,
        "ServiceControl.EditOf": "e-1",
        "NServiceBus.ExceptionInformation": "kept: the prefix is ExceptionInfo. with the dot",
        "ServiceControl.Retry.Attempt.MessageId": "an older attempt",
        "ServiceControl.TargetEndpointAddress": "an older target",
        "Custom": None,
    }

    headers = retry_wire.retry_headers(
        stored, unique_message_id="u-1", acknowledgement_queue="error", target_endpoint_address=None
    )

    # What ServiceControl's return-to-sender delivers: no attempt id, no target address.
    assert headers == {
        "NServiceBus.MessageId": "m-1",
        "NServiceBus.ExceptionInformation": "kept: the prefix is ExceptionInfo. with the dot",
        "Custom": None,
        "ServiceControl.Retry.UniqueMessageId": "u-1",
        "ServiceControl.Retry.AcknowledgementQueue": "error",
    }


def test_through_a_retry_to_proxy_the_target_address_rides_along() -> None:
    headers = retry_wire.retry_headers(
        {"NServiceBus.MessageId": "m-1"},
        unique_message_id="u-1",
        acknowledgement_queue="error",
        target_endpoint_address="Sales@HOST",
    )
    assert headers["ServiceControl.TargetEndpointAddress"] == "Sales@HOST"


@pytest.mark.parametrize(
    ("headers", "target", "route", "queue"),
    [
        ({}, "Sales@MACHINE", ("Sales@MACHINE", None), "Sales"),
        ({}, "Sales", ("Sales", None), "Sales"),
        (
            {"ServiceControl.RetryTo": "Sales.Retry"},
            "Sales@M",
            ("Sales.Retry", "Sales@M"),
            "Sales.Retry",
        ),
        ({"ServiceControl.RetryTo": " "}, "Sales@M", ("Sales@M", None), "Sales"),
    ],
)
def test_route_is_the_retry_to_proxy_carrying_the_target_else_the_target(
    headers: dict[str, str | None], target: str, route: tuple[str, str | None], queue: str
) -> None:
    assert retry_wire.retry_route(headers, target) == route
    assert retry_wire.queue_of_address(route[0]) == queue


def test_an_address_without_a_queue_is_unsendable() -> None:
    with pytest.raises(retry_wire.UnsendableMessage, match="names no usable queue"):
        retry_wire.queue_of_address("@MACHINE")


@pytest.mark.parametrize(
    "instant",
    [
        datetime(1, 1, 1, tzinfo=UTC),  # .NET's DateTime.MinValue
        datetime(999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC),
    ],
)
def test_the_nsb_wire_time_has_four_year_digits_and_reads_back(instant: datetime) -> None:
    # NServiceBus reads a wire time only at length 28; "1-01-01 ..." would be refused.
    text = retry_wire.format_nsb_time(instant)

    assert len(text) == 28
    assert parse_nsb_time(text) == instant


def test_locked_header_changes_treat_null_and_empty_alike() -> None:
    original = {"NServiceBus.MessageId": "m", "NServiceBus.CorrelationId": None, "X": "1"}
    assert retry_wire.locked_header_changes(original, {**original, "X": "2"}) == []
    assert (
        retry_wire.locked_header_changes(original, {**original, "NServiceBus.CorrelationId": ""})
        == []
    )
    # Removing one the original has is a change; adding one it lacked is not.
    assert retry_wire.locked_header_changes(original, {"X": "1", "NServiceBus.SagaId": "s"}) == [
        "NServiceBus.MessageId"
    ]


def test_confirm_successful_retry_sends_what_ingestion_reads_as_a_confirmation(
    tmp_path: Path,
) -> None:
    retried = {
        "NServiceBus.MessageId": "m-1",
        "ServiceControl.Retry.UniqueMessageId": "0d9b5a9e-3a4b-4f5c-9d8e-7f6a5b4c3d2e",
        "ServiceControl.Retry.AcknowledgementQueue": "errors-ack",
    }
    when = datetime(2026, 2, 3, 4, 5, 6, 789000, tzinfo=UTC)

    async def scenario() -> tuple[bool, bool, dict[str, str | None], bytes]:
        async with EmbeddedQueue(tmp_path / "q.db") as transport:
            not_a_retry = await confirm_successful_retry(transport, {"NServiceBus.MessageId": "x"})
            sent = await confirm_successful_retry(transport, retried, processed_at=when)
            async with Collector(transport, "errors-ack", prefetch=5) as collector:
                (delivery,) = await take(collector, 1)
                await collector.assert_idle(0.2)
            return not_a_retry, sent, delivery.headers, delivery.body

    not_a_retry, sent, headers, body = asyncio.run(asyncio.wait_for(scenario(), 30))

    assert (not_a_retry, sent, body) == (False, True, b"")
    assert headers["ServiceControl.Retry.Successful"] == "2026-02-03 04:05:06:789000 Z"
    assert headers["NServiceBus.ControlMessage"] == "True"
    assert is_retry_confirmation(headers) == retried["ServiceControl.Retry.UniqueMessageId"]


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        (postgresql.dialect(), "ON CONFLICT (failed_message_id) DO NOTHING RETURNING"),
        (sqlite.dialect(), "ON CONFLICT (failed_message_id) DO NOTHING RETURNING"),
    ],
)
def test_claims_compile_to_each_providers_insert_if_absent(dialect: object, expected: str) -> None:
    statement = claim_statement(provider_for(dialect), "batch", ["a", "b"])  # type: ignore[arg-type]
    sql = " ".join(str(statement.compile(dialect=dialect)).split())  # type: ignore[arg-type]
    assert sql.startswith("INSERT INTO failed_message_retries")
    assert expected in sql
