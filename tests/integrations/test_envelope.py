"""The Python task envelope: failures captured as text, headers ingestion reads, and broker
properties that survive the round trip a retry makes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.parsing import parse_failed_message
from controlroom.integrations import envelope


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def _raise_chained() -> BaseException:
    try:
        try:
            {}["missing"]
        except KeyError as exc:
            raise ValueError("bad order") from exc
    except ValueError as exc:
        return exc
    raise AssertionError


def test_capture_keeps_type_message_and_chained_traceback() -> None:
    failure = envelope.capture_failure(_raise_chained())
    assert failure.exception_type == "ValueError"
    assert failure.message == "bad order"
    assert failure.source == "builtins"
    assert failure.traceback.startswith("Traceback (most recent call last):")
    assert "KeyError: 'missing'" in failure.traceback
    assert "direct cause" in failure.traceback
    assert failure.traceback.rstrip().endswith("ValueError: bad order")


def test_capture_survives_an_exception_that_cannot_be_printed() -> None:
    failure = envelope.capture_failure(Unprintable())
    assert failure.exception_type == f"{__name__}.Unprintable"
    assert failure.message == "<exception str() failed>"


class OddModule(Exception):
    pass


OddModule.__module__ = 5  # type: ignore[assignment]  # any object, as Python allows


class TextThatCannotEncode(str):
    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        raise RuntimeError("no")


class OddText(Exception):
    def __str__(self) -> str:
        return TextThatCannotEncode("odd")


def test_capture_never_raises_for_a_class_whose_module_or_text_is_odd() -> None:
    # capture_failure's contract is "never raising"; an exception class may set
    # __module__ to any object, and __str__ may return a str subclass.
    odd_module = envelope.capture_failure(OddModule("m"))
    assert odd_module.exception_type == "5.OddModule" and odd_module.source == "5"
    assert odd_module.message == "m"
    odd_text = envelope.capture_failure(OddText())
    assert odd_text.message == "odd" and type(odd_text.message) is str


def test_capture_bounds_a_huge_traceback_and_says_so() -> None:
    failure = envelope.capture_failure(ValueError("x" * 100_000))
    assert len(failure.traceback) < envelope.MAX_TRACEBACK_CHARS + 100
    assert "characters cut" in failure.traceback
    assert failure.traceback.rstrip().endswith("x")
    assert "characters cut" in failure.message


def test_capture_escapes_lone_surrogates() -> None:
    failure = envelope.capture_failure(OSError("file \udcff"))
    assert failure.message == "file \\udcff"
    failure.traceback.encode("utf-8")


def test_headers_make_a_failed_message_ingestion_accepts() -> None:
    failure = envelope.capture_failure(_raise_chained())
    headers = envelope.failed_message_headers(
        kind=envelope.CELERY,
        task_id="5b0c3a6e-0c8e-4f53-9d43-0f2a4a3f8a11",
        task_name="shop.tasks.charge",
        queue="celery",
        endpoint="shop",
        host="worker-1",
        failure=failure,
        time_of_failure=datetime(2026, 12, 4, 10, 0, tzinfo=UTC),
        retries=3,
        content_type="application/json",
        properties={"content_type": "application/json", "headers": {"retries": 3}},
    )
    attempt = parse_failed_message(headers, b"[[1], {}, {}]", max_body_size_to_store=1 << 20)
    assert attempt.message_id == "5b0c3a6e-0c8e-4f53-9d43-0f2a4a3f8a11"
    assert attempt.queue_address == "celery"
    assert attempt.receiving_endpoint == "shop"
    assert attempt.exception_type == "ValueError"
    assert attempt.message_type == "shop.tasks.charge"
    assert headers[h.HOST_ID] == envelope.host_id("worker-1")
    assert headers[envelope.TASK_QUEUE] == "celery"


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="kind"):
        envelope.failed_message_headers(
            kind="rq",
            task_id="1",
            task_name="t",
            queue="q",
            endpoint="e",
            host="h",
            failure=envelope.capture_failure(ValueError()),
            time_of_failure=datetime.now(UTC),
        )


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text() | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(max_size=8).filter(lambda k: not k.startswith("$")), inner, max_size=4
        )
    ),
    max_leaves=12,
)


@given(
    headers=st.dictionaries(st.text(max_size=10), _json_values, max_size=6),
    content_type=st.none() | st.text(max_size=20),
    priority=st.none() | st.integers(0, 255),
)
def test_properties_round_trip(
    headers: dict, content_type: str | None, priority: int | None
) -> None:
    properties = {"headers": headers, "content_type": content_type, "priority": priority}
    restored = envelope.parse_properties(envelope.properties_json(properties))
    assert restored == {name: value for name, value in properties.items() if value is not None}


def test_properties_refuse_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown"):
        envelope.parse_properties('{"expiration": "10"}')


@pytest.mark.parametrize(
    "text",
    [
        '{"headers":{"a":{"$bytes":123}}}',
        '{"headers":{"a":{"$datetime":5}}}',
        '{"headers":{"a":' + "[" * 5000 + "]" * 5000 + "}}",
        '{"headers":{"a":123456789012345678901234567890}}',
    ],
)
def test_properties_amqp_cannot_carry_are_refused_as_bad_input(text: str) -> None:
    with pytest.raises(ValueError):
        envelope.parse_properties(text)


def test_a_task_body_nested_too_deep_has_no_arguments() -> None:
    from controlroom.errors.tasks import task_call

    assert task_call("celery", "[[" + "[" * 5000 + "]" * 5000 + "], {}, {}]") is None
