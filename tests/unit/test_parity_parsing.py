"""ServiceControl's reading of a failed message where ours once differed (docs/decisions.md
"Parsing follows ServiceControl where the design is silent"): minimal
messages, NServiceBus's own TimeOfFailure parser, bodies without a content type, empty
bodies."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.bodies import place_body
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.exceptions import MessageRejected
from tests.unit import V10, sample_headers

CAP = 102_400
RECEIVED = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def test_a_message_with_only_failed_q_and_message_id_is_a_failed_message() -> None:
    headers = {h.FAILED_Q: "Sales@MACHINE", h.MESSAGE_ID: "m-1"}

    attempt = parse_failed_message(headers, b"", max_body_size_to_store=CAP, received_at=RECEIVED)

    assert attempt.time_of_failure == RECEIVED  # no TimeOfFailure: when it was ingested
    assert attempt.receiving_endpoint == "Sales"
    assert attempt.queue_address == "Sales@MACHINE"
    assert attempt.exception_type is None
    assert attempt.message_type is None


def test_without_received_at_a_minimal_message_fails_now() -> None:
    before = datetime.now(UTC)
    attempt = parse_failed_message(
        {h.FAILED_Q: "Sales", h.MESSAGE_ID: "m-1"}, b"", max_body_size_to_store=CAP
    )
    assert before <= attempt.time_of_failure <= datetime.now(UTC)


def test_a_present_time_of_failure_wins_over_received_at() -> None:
    attempt = parse_failed_message(
        sample_headers(V10), b"{}", max_body_size_to_store=CAP, received_at=RECEIVED
    )
    stated = sample_headers(V10)[h.TIME_OF_FAILURE]
    assert stated is not None
    assert attempt.time_of_failure == h.parse_nsb_time(stated) != RECEIVED


@pytest.mark.parametrize("missing", [h.FAILED_Q, h.MESSAGE_ID])
def test_failed_q_and_message_id_stay_required(missing: str) -> None:
    headers = {h.FAILED_Q: "Sales", h.MESSAGE_ID: "m-1"}
    del headers[missing]
    with pytest.raises(MessageRejected, match=re.escape(missing)):
        parse_failed_message(headers, b"", max_body_size_to_store=CAP, received_at=RECEIVED)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # NServiceBus's DateTimeOffsetHelper: 28 characters, digits where the format has
        # digits, any other character anywhere else.
        ("2020-10-31 13,59,25,359877 Z", datetime(2020, 10, 31, 13, 59, 25, 359877, tzinfo=UTC)),
        ("2020/10/31T13.59.25.359877xZ", datetime(2020, 10, 31, 13, 59, 25, 359877, tzinfo=UTC)),
        ("2020-10-31 13:59:25:359877 X", datetime(2020, 10, 31, 13, 59, 25, 359877, tzinfo=UTC)),
    ],
)
def test_time_of_failure_is_read_as_nservicebus_reads_it(text: str, expected: datetime) -> None:
    assert h.parse_nsb_time(text, header=h.TIME_OF_FAILURE) == expected


@pytest.mark.parametrize(
    "text",
    [
        "2020-10-31 13:59:2x:359877 Z",  # a letter where a digit must be
        "2020-10-31 13:59:25:35987a Z",
        "2020-13-31 13:59:25:359877 Z",  # digits, but no such month
    ],
)
def test_a_28_character_time_without_digits_where_they_belong_is_rejected(text: str) -> None:
    with pytest.raises(MessageRejected, match=re.escape(h.TIME_OF_FAILURE)):
        h.parse_nsb_time(text, header=h.TIME_OF_FAILURE)


def test_no_content_type_means_a_binary_body() -> None:
    headers = sample_headers(V10)
    del headers[h.CONTENT_TYPE]

    attempt = parse_failed_message(headers, b"hello", max_body_size_to_store=CAP)

    assert attempt.content_type == "application/octet-stream"
    assert attempt.body_placement.external and attempt.body_placement.text is None
    assert attempt.body_key is not None


@pytest.mark.parametrize("content_type", ["text/plain", "application/octet-stream", None])
def test_an_empty_body_is_stored_nowhere(content_type: str | None) -> None:
    placement = place_body(b"", content_type, None, CAP)
    assert (placement.external, placement.text, placement.size) == (False, None, 0)


def test_an_empty_body_gets_no_store_key() -> None:
    attempt = parse_failed_message(sample_headers(V10), b"", max_body_size_to_store=CAP)
    assert attempt.body_key is None
    assert attempt.body_placement.size == 0
