"""``controlroom.demo``: deterministic, every variety present, parseable but for one."""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest

from controlroom.demo import DemoMessage, generate_demo_messages
from controlroom.demo_sizes import MIN_COUNT
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.exceptions import MessageRejected

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CAP = 102_400
NSB_TIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}:\d{6} Z")


@pytest.fixture(scope="module")
def messages() -> list[DemoMessage]:
    return generate_demo_messages(40, seed=7, now=NOW)


def with_failed_q(messages: list[DemoMessage]) -> list[DemoMessage]:
    return [m for m in messages if h.FAILED_Q in m.headers]


def test_same_seed_same_messages_other_seed_other_messages() -> None:
    first = generate_demo_messages(30, seed=11, now=NOW)

    assert generate_demo_messages(30, seed=11, now=NOW) == first
    assert generate_demo_messages(30, seed=12, now=NOW) != first


def test_count_is_honoured_down_to_the_showcase() -> None:
    assert len(generate_demo_messages(MIN_COUNT, seed=1, now=NOW)) == MIN_COUNT
    assert len(generate_demo_messages(75, seed=1, now=NOW)) == 75
    with pytest.raises(ValueError, match=str(MIN_COUNT)):
        generate_demo_messages(MIN_COUNT - 1, seed=1, now=NOW)


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone"):
        generate_demo_messages(seed=1, now=datetime(2026, 3, 1))


def test_exactly_one_message_lacks_failed_q_and_it_is_a_failed_import(
    messages: list[DemoMessage],
) -> None:
    broken = [m for m in messages if h.FAILED_Q not in m.headers]

    assert len(broken) == 1
    with pytest.raises(MessageRejected, match=h.FAILED_Q):
        parse_failed_message(broken[0].headers, broken[0].body, max_body_size_to_store=CAP)


def test_every_other_message_parses(messages: list[DemoMessage]) -> None:
    for message in with_failed_q(messages):
        parse_failed_message(message.headers, message.body, max_body_size_to_store=CAP)


def test_times_use_the_wire_format_lie_before_now_and_come_in_failure_order(
    messages: list[DemoMessage],
) -> None:
    failures = [m.headers[h.TIME_OF_FAILURE] for m in messages]

    for message in messages:
        for name in (h.TIME_OF_FAILURE, h.TIME_SENT):
            assert NSB_TIME.fullmatch(message.headers[name] or ""), name
    assert failures == sorted(failures)
    parsed = [h.parse_nsb_time(text or "") for text in failures]
    assert all(NOW - timedelta(hours=2) <= t <= NOW for t in parsed)


def test_endpoints_and_hosts_vary_and_each_host_has_one_stable_host_id(
    messages: list[DemoMessage],
) -> None:
    ids_by_host: dict[str, set[str]] = defaultdict(set)
    for message in messages:
        ids_by_host[message.headers[h.HOST_DISPLAY_NAME] or ""].add(
            message.headers[h.HOST_ID] or ""
        )
    endpoints = {h.processing_endpoint(m.headers) for m in messages}

    assert {"Sales", "Billing", "Shipping", "Warehouse"} <= endpoints
    assert len(ids_by_host) >= 5
    for host_ids in ids_by_host.values():
        [host_id] = host_ids
        assert re.fullmatch(r"[0-9a-f]{32}", host_id)
    assert len({next(iter(v)) for v in ids_by_host.values()}) == len(ids_by_host)


def test_one_message_fails_repeatedly_and_folds_to_one_id(messages: list[DemoMessage]) -> None:
    attempts: dict[str, list[datetime]] = defaultdict(list)
    for message in with_failed_q(messages):
        attempt = parse_failed_message(message.headers, message.body, max_body_size_to_store=CAP)
        attempts[attempt.unique_message_id].append(attempt.time_of_failure)

    assert max(len(times) for times in attempts.values()) >= 3
    for times in attempts.values():
        assert len(set(times)) == len(times)  # repeats are later attempts, not duplicates


def test_one_event_fails_in_two_subscriber_endpoints(messages: list[DemoMessage]) -> None:
    endpoints_by_message: dict[str, set[str | None]] = defaultdict(set)
    for message in messages:
        if message.headers[h.MESSAGE_INTENT] == "Publish":
            endpoints_by_message[message.headers[h.MESSAGE_ID] or ""].add(
                h.processing_endpoint(message.headers)
            )

    assert any(len(endpoints) == 2 for endpoints in endpoints_by_message.values())


def test_bodies_are_json_xml_binary_and_gzip(messages: list[DemoMessage]) -> None:
    by_type = defaultdict(list)
    for message in messages:
        by_type[message.headers[h.CONTENT_TYPE]].append(message)

    plain_json = [m for m in by_type["application/json"] if h.CONTENT_ENCODING not in m.headers]
    assert all(isinstance(json.loads(m.body), dict) for m in plain_json)
    assert all(m.body.startswith(b"<?xml") for m in by_type["text/xml"])
    [binary] = by_type["application/octet-stream"]
    assert b"\x00" in binary.body
    [gzipped] = [m for m in messages if m.headers.get(h.CONTENT_ENCODING) == "gzip"]
    assert isinstance(json.loads(gzip.decompress(gzipped.body)), dict)


def test_bodies_are_small_and_one_is_over_the_cap(messages: list[DemoMessage]) -> None:
    sizes = sorted(len(m.body) for m in messages)

    assert sizes[0] < 1024
    assert sizes[-1] > CAP
    assert sizes[-2] <= CAP


def test_stack_traces_are_multi_line_dotnet_and_python(messages: list[DemoMessage]) -> None:
    traces = [m.headers[h.EXCEPTION_STACK_TRACE] or "" for m in messages]

    dotnet = [t for t in traces if "\n   at " in t]
    python = [t for t in traces if t.startswith("Traceback (most recent call last):")]
    assert dotnet and python
    assert any("--- End of inner exception stack trace ---" in t for t in dotnet)
    assert any("During handling of the above exception" in t for t in python)
    assert all(t.count("\n") >= 4 for t in dotnet + python)


def test_msmq_addresses_and_a_v5_message_without_processing_endpoint(
    messages: list[DemoMessage],
) -> None:
    addresses = [m.headers[h.FAILED_Q] or "" for m in with_failed_q(messages)]
    v5 = [m for m in messages if h.PROCESSING_ENDPOINT not in m.headers]

    assert any(re.fullmatch(r"[\w.]+@[\w-]+", address) for address in addresses)
    [legacy] = v5
    assert legacy.headers["NServiceBus.Version"] == "5.2.14"
    assert h.processing_endpoint(legacy.headers) == "Legacy.Fulfillment"


@pytest.mark.parametrize("seed", range(20))
def test_repeats_are_distinct_later_attempts_for_any_seed(seed: int) -> None:
    """Two attempts at one time would fold into one; every repeat must be later."""
    times: dict[tuple[str | None, str | None], list[str | None]] = defaultdict(list)
    for message in generate_demo_messages(300, seed=seed, now=NOW):
        key = (message.headers[h.MESSAGE_ID], h.processing_endpoint(message.headers))
        times[key].append(message.headers[h.TIME_OF_FAILURE])

    assert all(len(set(attempts)) == len(attempts) for attempts in times.values())
    assert max(len(attempts) for attempts in times.values()) >= 3
