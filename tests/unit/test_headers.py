"""The wire contract: header names and value parsing, on the real sample header sets."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlroom.errors.ingest import headers as h
from controlroom.exceptions import MessageRejected
from tests.unit import V5, V6, V8, V10, sample_entries, sample_headers


def test_header_names_are_the_wire_names() -> None:
    assert h.MESSAGE_ID == "NServiceBus.MessageId"
    assert h.FAILED_Q == "NServiceBus.FailedQ"
    assert h.PROCESSING_ENDPOINT == "NServiceBus.ProcessingEndpoint"
    assert h.TIME_OF_FAILURE == "NServiceBus.TimeOfFailure"
    assert h.EXCEPTION_TYPE == "NServiceBus.ExceptionInfo.ExceptionType"
    assert h.EXCEPTION_MESSAGE == "NServiceBus.ExceptionInfo.Message"
    assert h.EXCEPTION_SOURCE == "NServiceBus.ExceptionInfo.Source"
    assert h.EXCEPTION_STACK_TRACE == "NServiceBus.ExceptionInfo.StackTrace"
    assert h.ENCLOSED_MESSAGE_TYPES == "NServiceBus.EnclosedMessageTypes"
    assert h.HOST_ID == "$.diagnostics.hostid"
    assert h.HOST_DISPLAY_NAME == "$.diagnostics.hostdisplayname"
    assert h.ORIGINATING_HOST_ID == "$.diagnostics.originating.hostid"
    assert h.RETRY_UNIQUE_MESSAGE_ID == "ServiceControl.Retry.UniqueMessageId"
    assert h.RETRY_SUCCESSFUL == "ServiceControl.Retry.Successful"


def test_every_sample_uses_the_header_names_defined_here() -> None:
    names = {value for key, value in vars(h).items() if key.isupper() and isinstance(value, str)}
    used = {name for entry in sample_entries() for name in entry["headers"]}
    for required in (h.MESSAGE_ID, h.FAILED_Q, h.TIME_OF_FAILURE, h.EXCEPTION_STACK_TRACE):
        assert required in used
    assert {name for name in used if name.startswith("$.")} <= names


# --- times --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-04-29 22:06:16:406166 Z", datetime(2026, 4, 29, 22, 6, 16, 406166, tzinfo=UTC)),
        ("2026-04-29 22:06:16:4 Z", datetime(2026, 4, 29, 22, 6, 16, 400000, tzinfo=UTC)),
        ("2026-04-29 22:06:16:001 Z", datetime(2026, 4, 29, 22, 6, 16, 1000, tzinfo=UTC)),
        ("2026-04-29 22:06:16:4061669 Z", datetime(2026, 4, 29, 22, 6, 16, 406166, tzinfo=UTC)),
        ("2026-04-29 22:06:16 Z", datetime(2026, 4, 29, 22, 6, 16, tzinfo=UTC)),
        (" 2026-04-29 22:06:16:406166 Z\n", datetime(2026, 4, 29, 22, 6, 16, 406166, tzinfo=UTC)),
        # ISO 8601 fallback: Z, offsets (converted to UTC), no offset (read as UTC).
        ("2026-04-29T22:06:16.406166Z", datetime(2026, 4, 29, 22, 6, 16, 406166, tzinfo=UTC)),
        ("2026-04-30T00:06:16+02:00", datetime(2026, 4, 29, 22, 6, 16, tzinfo=UTC)),
        ("2026-04-29T22:06:16.4061667+00:00", datetime(2026, 4, 29, 22, 6, 16, 406166, tzinfo=UTC)),
        ("2026-04-29 22:06:16", datetime(2026, 4, 29, 22, 6, 16, tzinfo=UTC)),
    ],
)
def test_parse_nsb_time(text: str, expected: datetime) -> None:
    parsed = h.parse_nsb_time(text, header=h.TIME_OF_FAILURE)
    assert parsed == expected
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize(
    "text",
    [
        "",
        "yesterday",
        "2026-13-29 22:06:16:406166 Z",  # month 13
        "2026-02-30 22:06:16:406166 Z",  # 30 February
        "2026-04-29 25:06:16:406166 Z",
        "2026-04-29 22:06:16:406166 PST",
        "٢٠٢٦-04-29 22:06:16:406166 Z",  # non-ASCII digits
        "2026-04-29 22:06:16:406166 Z" + " " * 10 + "x" * 1_000_000,
    ],
)
def test_garbage_time_is_rejected_naming_the_header(text: str) -> None:
    with pytest.raises(MessageRejected, match=re.escape("NServiceBus.TimeSent")) as caught:
        h.parse_nsb_time(text, header=h.TIME_SENT)
    assert len(caught.value.reason) < 300  # a 1 MB value is not copied into the reason


@pytest.mark.parametrize("index", [V10, V8, V6, V5])
def test_every_sample_time_parses(index: int) -> None:
    headers = sample_headers(index)
    failed = h.parse_nsb_time(headers[h.TIME_OF_FAILURE] or "", header=h.TIME_OF_FAILURE)
    sent = h.parse_nsb_time(headers[h.TIME_SENT] or "", header=h.TIME_SENT)
    assert sent < failed


@given(st.datetimes(timezones=st.just(UTC)))
def test_wire_format_round_trips(moment: datetime) -> None:
    # .NET "yyyy" pads the year to four digits; strftime("%Y") does not on Linux.
    wire = f"{moment.year:04d}" + moment.strftime("-%m-%d %H:%M:%S:%f Z")
    assert h.parse_nsb_time(wire) == moment


# --- endpoints ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (V10, "HeaderWriterError"),
        (V8, "HeaderWriterError"),
        (V6, "HeaderWriterErrorV6"),
        # v5 has no ProcessingEndpoint: FailedQ "HeaderWriterErrorV5@MACHINENAME" before "@".
        (V5, "HeaderWriterErrorV5"),
    ],
)
def test_processing_endpoint_of_the_samples(index: int, expected: str) -> None:
    assert h.processing_endpoint(sample_headers(index)) == expected


def test_v5_sample_really_lacks_processing_endpoint() -> None:
    assert h.PROCESSING_ENDPOINT not in sample_headers(V5)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"NServiceBus.ProcessingEndpoint": "A", "NServiceBus.FailedQ": "B@m"}, "A"),
        ({"NServiceBus.ProcessingEndpoint": "", "NServiceBus.FailedQ": "B@m"}, "B"),
        ({"NServiceBus.ProcessingEndpoint": None, "NServiceBus.FailedQ": "B"}, "B"),
        ({"NServiceBus.FailedQ": "B@m@n"}, "B"),
        ({"NServiceBus.FailedQ": "@m", "NServiceBus.ReplyToAddress": "C@m"}, "C"),
        ({"NServiceBus.ReplyToAddress": "C"}, "C"),
        ({"NServiceBus.FailedQ": "@m"}, None),
        ({}, None),
    ],
)
def test_processing_endpoint_fallbacks(headers: dict[str, str | None], expected: str) -> None:
    assert h.processing_endpoint(headers) == expected


def test_receiving_and_sending_hosts_of_a_sample() -> None:
    headers = sample_headers(V10)
    assert h.receiving_host_id(headers) == "daaf5ebc-8d6a-51b7-b0dc-cdd8b15c3626"
    assert h.receiving_host(headers) == "MACHINENAME"
    assert h.sending_endpoint(headers) == "HeaderWriterError"
    assert h.sending_host_id(headers) == "daaf5ebc-8d6a-51b7-b0dc-cdd8b15c3626"
    assert h.sending_host(headers) == "MACHINENAME"


def test_receiving_host_falls_back_to_processing_machine_then_failed_queue_machine() -> None:
    assert h.receiving_host({"NServiceBus.ProcessingMachine": "pm", "NServiceBus.FailedQ": "q@f"})
    assert h.receiving_host({"NServiceBus.FailedQ": "q@box"}) == "box"
    assert h.receiving_host({"NServiceBus.FailedQ": "q"}) is None


def test_sending_endpoint_falls_back_to_originating_address() -> None:
    headers = {"NServiceBus.OriginatingAddress": "Billing@box-2"}
    assert h.sending_endpoint(headers) == "Billing"
    assert h.sending_host(headers) == "box-2"


@pytest.mark.parametrize(
    ("raw", "stored"),
    [
        ("daaf5ebc8d6a51b7b0dccdd8b15c3626", "daaf5ebc-8d6a-51b7-b0dc-cdd8b15c3626"),
        ("DAAF5EBC-8D6A-51B7-B0DC-CDD8B15C3626", "daaf5ebc-8d6a-51b7-b0dc-cdd8b15c3626"),
        ("my-host-7", "my-host-7"),  # not a GUID: kept as written
    ],
)
def test_host_id_is_normalised_to_d_form_or_kept_raw(raw: str, stored: str) -> None:
    assert h.receiving_host_id({h.HOST_ID: raw}) == stored
    assert h.sending_host_id({h.ORIGINATING_HOST_ID: raw}) == stored


def test_absent_host_ids_are_none() -> None:
    assert h.receiving_host_id({}) is None
    assert h.sending_host_id({h.ORIGINATING_HOST_ID: None}) is None


# --- message type and system messages -----------------------------------------------------
def test_message_type_of_the_samples() -> None:
    assert h.message_type(sample_headers(V10)) == "Core.Headers.Writers.MyNamespace.MessageToSend"
    assert h.message_type(sample_headers(V5)) == "Core5.Headers.Writers.MyNamespace.MessageToSend"


@pytest.mark.parametrize(
    ("enclosed", "expected"),
    [
        ("  Ns.Order , Asm, Version=1.0.0.0", "Ns.Order"),
        ("Ns.Order", "Ns.Order"),
        ("Ns.Order, Asm;Ns.IOrder, Asm", "Ns.Order"),
        (" , Asm", None),
        ("", None),
        (None, None),
    ],
)
def test_message_type_is_the_first_comma_part_stripped(
    enclosed: str | None, expected: str | None
) -> None:
    assert h.message_type({h.ENCLOSED_MESSAGE_TYPES: enclosed}) == expected


@pytest.mark.parametrize("index", [V10, V8, V6, V5])
def test_samples_are_not_system_messages(index: int) -> None:
    assert h.is_system_message(sample_headers(index)) is False


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({h.CONTROL_MESSAGE: "True"}, True),
        ({h.CONTROL_MESSAGE: "false"}, False),
        ({}, False),  # no control header and no type: not a system message (ServiceControl)
        ({h.ENCLOSED_MESSAGE_TYPES: "NServiceBus.Scheduling.Messages.ScheduledTask, NSB"}, True),
        # ServiceControl: an enclosed type decides, even over the control-message header.
        ({h.ENCLOSED_MESSAGE_TYPES: "Ns.Order", h.CONTROL_MESSAGE: "True"}, False),
    ],
)
def test_is_system_message_follows_servicecontrol(
    headers: dict[str, str | None], expected: bool
) -> None:
    assert h.is_system_message(headers) is expected


# --- body description ---------------------------------------------------------------------
def test_content_type_defaults_to_binary() -> None:
    assert h.content_type({}) == "application/octet-stream"
    assert h.content_type({h.CONTENT_TYPE: ""}) == "application/octet-stream"
    assert h.content_type(sample_headers(V10)) == "application/json"
    assert h.content_type(sample_headers(V8)) == "text/xml"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"Content-Encoding": "gzip"}, "gzip"),
        ({"NServiceBus.ContentEncoding": "br"}, "br"),
        ({"Content-Encoding": "identity"}, None),
        ({"Content-Encoding": " "}, None),
    ],
)
def test_content_encoding(headers: dict[str, str], expected: str | None) -> None:
    assert h.content_encoding(headers) == expected


# --- JSON ---------------------------------------------------------------------------------
@pytest.mark.parametrize("index", [V10, V8, V6, V5])
def test_headers_json_round_trips_the_samples(index: int) -> None:
    headers = sample_headers(index)
    assert json.loads(h.headers_to_json(headers)) == headers


def test_headers_json_is_stable_sorted_unescaped_and_keeps_nulls() -> None:
    one = {"b": "ü", "a": None, "c": "x\x00y"}
    other = {"c": "x\x00y", "a": None, "b": "ü"}
    text = h.headers_to_json(one)
    assert text == h.headers_to_json(other)
    assert text == '{"a":null,"b":"ü","c":"x\\u0000y"}'


def test_headers_json_escapes_lone_surrogates_and_still_round_trips() -> None:
    headers = {"k": "bad \udc80 byte", "n": "ü"}
    text = h.headers_to_json(headers)
    text.encode("utf-8")  # storable
    assert json.loads(text) == headers


@given(st.dictionaries(st.text(), st.one_of(st.none(), st.text())))
def test_headers_json_always_round_trips_and_encodes(headers: dict[str, str | None]) -> None:
    text = h.headers_to_json(headers)
    text.encode("utf-8")
    assert json.loads(text) == headers


def test_sanitize_text_replaces_nul_and_lone_surrogates_only() -> None:
    assert h.sanitize_text("a\x00b\udc80cü") == "a\ufffdb\ufffdcü"
    assert h.sanitize_text("plain") == "plain"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0f8fad5bd9cb469fa16570867728950e", "0f8fad5b-d9cb-469f-a165-70867728950e"),
        ("{0F8FAD5B-D9CB-469F-A165-70867728950E}", "0f8fad5b-d9cb-469f-a165-70867728950e"),
        ("0f8fad5b-d9cb-469f-a165-70867728950e\n", None),
        ("0f8f-ad5bd9cb-469fa165-70867728950e", None),  # uuid.UUID() would accept this
        ("urn:uuid:0f8fad5b-d9cb-469f-a165-70867728950e", None),
        ("x" * 10_000, None),
    ],
)
def test_parse_guid_takes_only_dotnet_spellings(text: str, expected: str | None) -> None:
    assert h.parse_guid(text) == expected


def test_a_time_beyond_the_last_utc_instant_is_rejected_naming_the_header() -> None:
    from controlroom.errors.ingest.headers import parse_nsb_time
    from controlroom.exceptions import MessageRejected

    with pytest.raises(MessageRejected, match=r"NServiceBus\.TimeSent"):
        parse_nsb_time("9999-12-31T23:59:59-05:00", header="NServiceBus.TimeSent")
