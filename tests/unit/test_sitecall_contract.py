"""The telemetry contract refuses, naming the field, values no store can hold: a time
outside years 1-9999 once in UTC, details_json nested past what a parser can read."""

from __future__ import annotations

import json

import pytest

from controlroom.telemetry.contract import TelemetryRejected, parse_packet, validate_packet
from tests.sitecalls.packets import packet

EVENT_ID = "9a1c7e52-0b3d-4f8a-8e21-6d5b4c3a2f10"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("updated_at_utc", "9999-12-31T23:59:59-01:00"),
        ("created_at_utc", "0001-01-01T00:00:00+01:00"),
    ],
)
def test_a_time_outside_the_utc_range_is_refused_by_name(field: str, value: str) -> None:
    with pytest.raises(TelemetryRejected) as refused:
        validate_packet(packet("Attempted", **{field: value}))
    assert refused.value.reason.startswith(f"{field}:")


def test_an_event_time_outside_the_utc_range_is_refused_by_name() -> None:
    data = packet("Attempted", event_id=EVENT_ID)
    data["audit_event"]["occurred_at_utc"] = "0001-01-01T00:00:00+05:00"
    with pytest.raises(TelemetryRejected) as refused:
        validate_packet(data)
    assert refused.value.reason.startswith("audit_event.occurred_at_utc:")


@pytest.mark.parametrize(
    "details",
    # Breaker pass (sixth): Python's constants were taken as JSON text (RFC 8259 has none).
    ["[" * 5000, "[" * 200_000, '"\ud800"', '"a\x00"', "NaN", '{"a": Infinity}', "[-Infinity]"],
)
def test_unreadable_details_json_is_refused_by_name(details: str) -> None:
    data = packet("Attempted", event_id=EVENT_ID)
    data["audit_event"]["details_json"] = details
    with pytest.raises(TelemetryRejected) as refused:
        validate_packet(data)
    assert refused.value.reason.startswith("audit_event.details_json:")


def test_a_deeply_nested_body_is_refused() -> None:
    with pytest.raises(TelemetryRejected):
        parse_packet(b"[" * 100_000)


@pytest.mark.parametrize("site", [" north", "north ", "no\x1brth", "   "])
def test_a_source_site_no_site_id_could_be_is_refused(site: str) -> None:
    """Breaker pass (third): the contract took a ``source_site`` with a space at an end or
    a control character, which no configured site's id may hold (README "Site call
    audit": a site's id is printable, without space at either end)."""
    data = packet("Attempted", event_id=EVENT_ID)
    data["source_site"] = site
    with pytest.raises(TelemetryRejected) as refused:
        validate_packet(data)
    assert refused.value.reason.startswith("source_site:")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_a_packet_in_another_encoding_than_utf_8_is_refused(encoding: str) -> None:
    """Breaker pass (third): the queue's packets were decoded as JSON detects them, so a
    UTF-16 packet was accepted though the contract is UTF-8 (README "Site call audit")."""
    body = json.dumps(packet("Attempted", event_id=EVENT_ID)).encode(encoding)
    with pytest.raises(TelemetryRejected) as refused:
        parse_packet(body)
    assert "not UTF-8 JSON" in refused.value.reason


def test_a_utf_8_packet_is_read_with_or_without_a_byte_order_mark() -> None:
    body = json.dumps(packet("Attempted", event_id=EVENT_ID)).encode()
    assert parse_packet(b"\xef\xbb\xbf" + body) == parse_packet(body)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("retry_count", "7"),
        ("retry_count", True),
        ("retry_count", 2.0),
        ("epoch", True),
        ("http_status", 200.0),
        ("created_at_utc", 0),
        ("updated_at_utc", -1e10),
        ("updated_at_utc", "1764580000"),
    ],
)
def test_values_are_taken_as_sent_never_coerced(field: str, value: object) -> None:
    # README: integers are JSON integers, times ISO 8601 text with a zone.
    with pytest.raises(TelemetryRejected) as refused:
        validate_packet(packet("Attempted", **{field: value}))
    assert refused.value.reason.startswith(f"{field}:")


def test_payload_truncated_is_a_json_boolean() -> None:
    data = packet("Attempted", event_id=EVENT_ID)
    data["audit_event"]["payload_truncated"] = "yes"
    with pytest.raises(TelemetryRejected) as refused:
        validate_packet(data)
    assert refused.value.reason.startswith("audit_event.payload_truncated:")


@pytest.mark.parametrize(
    ("name", "named"),
    [("surprise", "surprise"), ("a\ud800", "a\\ud800"), ("a\x00", "a\\x00")],
    ids=["unknown", "lone-surrogate", "nul"],
)
def test_a_field_the_contract_does_not_know_is_named_as_storable_text(
    name: str, named: str
) -> None:
    # A name that is not text (a lone surrogate) made pydantic's error name no field.
    with pytest.raises(TelemetryRejected) as refused:
        validate_packet({**packet("Attempted"), name: 1})
    assert refused.value.reason == f"{named}: not a field of a telemetry packet"
