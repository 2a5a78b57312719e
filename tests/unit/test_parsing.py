"""From error-queue message to FailedAttempt, on the real sample header sets."""

from __future__ import annotations

import gzip
import json
import re
from datetime import UTC, datetime

import pytest

from controlroom.errors.ingest.bodies import body_key
from controlroom.errors.ingest.grouping import classify
from controlroom.errors.ingest.identity import known_endpoint_id
from controlroom.errors.ingest.parsing import is_retry_confirmation, parse_failed_message
from controlroom.errors.model import FailedAttempt
from controlroom.exceptions import MessageRejected
from tests.unit import SAMPLE_UNIQUE_IDS, V5, V6, V8, V10, sample_headers

CAP = 102_400
RETRY_ID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def _parse(headers: dict[str, str | None], body: bytes = b"<a/>", cap: int = CAP) -> FailedAttempt:
    return parse_failed_message(headers, body, max_body_size_to_store=cap)


@pytest.mark.parametrize("index", [V10, V8, V6, V5])
def test_every_sample_parses_with_its_unique_id(index: int) -> None:
    headers = sample_headers(index)
    attempt = _parse(headers)
    assert attempt.unique_message_id == SAMPLE_UNIQUE_IDS[index]
    assert attempt.message_id == headers["NServiceBus.MessageId"]
    assert attempt.queue_address == headers["NServiceBus.FailedQ"]
    assert json.loads(attempt.headers_json) == headers
    assert attempt.headers == headers
    assert attempt.groups == classify(headers)
    assert len(attempt.groups) == 5
    assert attempt.is_system_message is False


def test_the_nservicebus_10_sample_in_full() -> None:
    attempt = _parse(sample_headers(V10), b'{"a":1}')
    host_id = "daaf5ebc-8d6a-51b7-b0dc-cdd8b15c3626"
    assert attempt.unique_message_id == "4d0fa359-a748-5c14-e6c2-70c018dc84f7"
    assert attempt.time_of_failure == datetime(2026, 4, 29, 22, 6, 16, 406166, tzinfo=UTC)
    assert attempt.time_sent == datetime(2026, 4, 29, 22, 6, 16, 354264, tzinfo=UTC)
    assert attempt.receiving_endpoint == "HeaderWriterError"
    assert (attempt.receiving_host_id, attempt.receiving_host) == (host_id, "MACHINENAME")
    assert attempt.sending_endpoint == "HeaderWriterError"
    assert (attempt.sending_host_id, attempt.sending_host) == (host_id, "MACHINENAME")
    assert attempt.message_type == "Core.Headers.Writers.MyNamespace.MessageToSend"
    assert attempt.conversation_id == "be6afcc4-3295-4b6c-8d2f-b43b016c458b"
    assert attempt.content_type == "application/json"
    assert attempt.exception_type == "System.Exception"
    assert attempt.exception_message == "The exception message from the handler."
    assert attempt.exception_source == "Core_10"
    assert attempt.stack_trace is not None and attempt.stack_trace.startswith("System.Exception")
    assert attempt.body == b'{"a":1}'
    assert (attempt.body_placement.text, attempt.body_placement.external) == ('{"a":1}', False)
    assert attempt.body_key is None
    # Sender and receiver are the same instance: one known endpoint, not two.
    endpoint_id = known_endpoint_id("HeaderWriterError", host_id)
    assert [(e.id, e.name, e.host_id, e.host) for e in attempt.endpoints] == [
        (endpoint_id, "HeaderWriterError", host_id, "MACHINENAME")
    ]


def test_v5_sample_takes_its_endpoint_from_the_failed_queue() -> None:
    attempt = _parse(sample_headers(V5))
    assert attempt.receiving_endpoint == "HeaderWriterErrorV5"
    assert attempt.queue_address == "HeaderWriterErrorV5@MACHINENAME"


def test_sender_and_receiver_on_different_hosts_are_two_endpoints() -> None:
    headers = sample_headers(V10) | {
        "NServiceBus.OriginatingEndpoint": "Sales",
        "$.diagnostics.originating.hostid": "11111111111111111111111111111111",
        "NServiceBus.OriginatingMachine": "box-2",
    }
    endpoints = _parse(headers).endpoints
    assert [(e.name, e.host_id, e.host) for e in endpoints] == [
        ("HeaderWriterError", "daaf5ebc-8d6a-51b7-b0dc-cdd8b15c3626", "MACHINENAME"),
        ("Sales", "11111111-1111-1111-1111-111111111111", "box-2"),
    ]


def test_endpoints_without_host_ids_are_not_known_endpoints() -> None:
    headers = sample_headers(V10)
    del headers["$.diagnostics.hostid"], headers["$.diagnostics.originating.hostid"]
    assert _parse(headers).endpoints == ()


@pytest.mark.parametrize("missing", ["NServiceBus.FailedQ", "NServiceBus.MessageId"])
def test_missing_required_header_is_rejected_naming_it(missing: str) -> None:
    headers = sample_headers(V10)
    del headers[missing]
    with pytest.raises(MessageRejected, match=re.escape(missing)):
        _parse(headers)
    headers[missing] = ""
    with pytest.raises(MessageRejected, match=re.escape(missing)):
        _parse(headers)


def test_unparseable_time_of_failure_is_rejected_naming_it() -> None:
    headers = sample_headers(V10) | {"NServiceBus.TimeOfFailure": "last tuesday"}
    with pytest.raises(MessageRejected, match=re.escape("NServiceBus.TimeOfFailure")):
        _parse(headers)


def test_unparseable_time_sent_only_empties_time_sent() -> None:
    headers = sample_headers(V10) | {"NServiceBus.TimeSent": "last tuesday"}
    attempt = _parse(headers)
    assert attempt.time_sent is None
    assert json.loads(attempt.headers_json)["NServiceBus.TimeSent"] == "last tuesday"


def test_a_value_longer_than_its_column_is_rejected_naming_the_header() -> None:
    headers = sample_headers(V10) | {"NServiceBus.ConversationId": "c" * 401}
    with pytest.raises(MessageRejected, match=r"NServiceBus\.ConversationId.*400"):
        _parse(headers)


def test_content_type_defaults_to_binary() -> None:
    headers = sample_headers(V10)
    del headers["NServiceBus.ContentType"]
    attempt = _parse(headers, b"hello")
    assert attempt.content_type == "application/octet-stream"
    assert attempt.body_placement.text is None and attempt.body_placement.external


def test_an_external_body_gets_its_key() -> None:
    body = b"a" * (CAP + 1)
    attempt = _parse(sample_headers(V10), body)
    assert attempt.body_placement.external is True
    assert attempt.body_placement.text == "a" * CAP
    assert attempt.body_key == body_key(attempt.unique_message_id, body)


def test_a_gzip_content_encoding_header_makes_the_body_binary() -> None:
    body = gzip.compress(b'{"a": 1}')
    attempt = _parse(sample_headers(V10) | {"Content-Encoding": "gzip"}, body)
    assert (attempt.body_placement.external, attempt.body_placement.text) == (True, None)
    assert attempt.body_placement.size == len(body)
    assert attempt.body_key == body_key(attempt.unique_message_id, body)


def test_a_retried_message_that_fails_again_keeps_its_unique_id() -> None:
    headers = sample_headers(V8) | {"ServiceControl.Retry.UniqueMessageId": RETRY_ID.upper()}
    assert _parse(headers).unique_message_id == RETRY_ID


def test_derived_columns_are_storable_and_headers_json_is_exact() -> None:
    headers = sample_headers(V10) | {"NServiceBus.ExceptionInfo.Message": "bad\x00byte\udc80"}
    attempt = _parse(headers)
    assert attempt.exception_message == "bad\ufffdbyte\ufffd"
    assert json.loads(attempt.headers_json)["NServiceBus.ExceptionInfo.Message"] == (
        "bad\x00byte\udc80"
    )


def test_a_control_message_without_enclosed_types_is_a_system_message() -> None:
    headers = sample_headers(V10) | {"NServiceBus.ControlMessage": "True"}
    del headers["NServiceBus.EnclosedMessageTypes"]
    attempt = _parse(headers)
    assert attempt.is_system_message is True
    assert attempt.message_type is None


# --- retry confirmations ------------------------------------------------------------------
@pytest.mark.parametrize("index", [V10, V8, V6, V5])
def test_samples_are_not_retry_confirmations(index: int) -> None:
    assert is_retry_confirmation(sample_headers(index)) is None


@pytest.mark.parametrize(
    "headers",
    [
        # From an endpoint (RetryAcknowledgementBehavior): a control message.
        {
            "ServiceControl.Retry.Successful": "2026-04-29T22:06:16.4061667+00:00",
            "ServiceControl.Retry.UniqueMessageId": RETRY_ID,
            "NServiceBus.ControlMessage": "True",
        },
        # From ServiceControl's audit instance: no control-message header, any Successful value.
        {"ServiceControl.Retry.Successful": "", "ServiceControl.Retry.UniqueMessageId": RETRY_ID},
    ],
)
def test_retry_confirmation_names_the_message_it_resolves(headers: dict[str, str]) -> None:
    assert is_retry_confirmation(headers) == RETRY_ID


def test_retry_confirmation_id_is_normalised() -> None:
    headers = {
        "ServiceControl.Retry.Successful": "x",
        "ServiceControl.Retry.UniqueMessageId": RETRY_ID.replace("-", "").upper(),
    }
    assert is_retry_confirmation(headers) == RETRY_ID


@pytest.mark.parametrize("unique_id", [None, "MyId"])
def test_retry_confirmation_without_a_guid_is_rejected(unique_id: str | None) -> None:
    headers: dict[str, str | None] = {"ServiceControl.Retry.Successful": "x"}
    if unique_id is not None:
        headers["ServiceControl.Retry.UniqueMessageId"] = unique_id
    with pytest.raises(MessageRejected, match=re.escape("ServiceControl.Retry.UniqueMessageId")):
        is_retry_confirmation(headers)
