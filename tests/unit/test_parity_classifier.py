"""The five classifiers on the real NServiceBus header samples (tests/data/), with
ServiceControl 6.15's rules for the exception classifier (docs/decisions.md "Classification
follows ServiceControl 6.15"): a frame line begins
with any word (localized .NET traces), every occurrence of the exception message is
removed before frames are read, a trace without a frame is ``<type>: No stacktrace``, and a
message without an exception type is still grouped (``: No stacktrace``)."""

from __future__ import annotations

import pytest

from controlroom.errors.ingest import grouping as g
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.identity import group_id
from tests.unit import V5, V6, V8, V10, sample_headers

V10_TITLE = (
    "System.Exception: Core.Headers.Writers.HeaderWriterError.MessageHandler.Handle"
    "(MessageToSend message, IMessageHandlerContext context)"
)
V6_TITLE = (
    "System.Exception: Core6.Headers.Writers.HeaderWriterError.MessageHandler.Handle"
    "(MessageToSend message, IMessageHandlerContext context)"
)

# What each sample gives under every classifier, in ServiceControl's order.
EXPECTED: dict[int, list[tuple[str, str]]] = {
    V10: [
        (g.EXCEPTION_TYPE_AND_STACK_TRACE, V10_TITLE),
        (g.MESSAGE_TYPE, "Core.Headers.Writers.MyNamespace.MessageToSend"),
        (g.ENDPOINT_ADDRESS, "HeaderWriterError"),
        (g.ENDPOINT_INSTANCE, "daaf5ebc8d6a51b7b0dccdd8b15c3626"),
        (g.ENDPOINT_NAME, "HeaderWriterError"),
    ],
}

# The word .NET writes before each frame, by UI culture.
LOCALIZED_AT = {"de": "bei", "fr": "à", "es": "en", "ru": "в", "it": "in", "pt": "em"}


def localized(headers: dict[str, str | None], word: str) -> dict[str, str | None]:
    trace = headers[h.EXCEPTION_STACK_TRACE]
    assert trace is not None and "\n   at " in trace
    return headers | {h.EXCEPTION_STACK_TRACE: trace.replace("\n   at ", f"\n   {word} ")}


def test_the_nservicebus_10_sample_under_the_five_classifiers() -> None:
    groups = g.classify(sample_headers(V10))
    assert [(group.classifier, group.title) for group in groups] == EXPECTED[V10]
    for group in groups:
        assert group.id == group_id(group.classifier, group.title)


@pytest.mark.parametrize("index", [V10, V8, V6, V5])
def test_every_sample_gets_all_five_classifiers(index: int) -> None:
    groups = g.classify(sample_headers(index))
    # A .NET trace gets ServiceControl's five and nothing from the Python classifier.
    assert [group.classifier for group in groups] == [c.name for c in g.SERVICECONTROL_CLASSIFIERS]
    exception_title = groups[0].title
    assert not exception_title.endswith(": No stacktrace"), exception_title
    assert exception_title.startswith("System.Exception: ")


def test_the_v6_async_sample_takes_the_handler_frame() -> None:
    assert g.classify(sample_headers(V6))[0].title == V6_TITLE


@pytest.mark.parametrize("culture", sorted(LOCALIZED_AT))
@pytest.mark.parametrize("index", [V10, V6])
def test_a_localized_trace_is_grouped_with_the_english_one(index: int, culture: str) -> None:
    english = g.classify(sample_headers(index))[0]
    translated = g.classify(localized(sample_headers(index), LOCALIZED_AT[culture]))[0]
    assert translated == english  # same title, same group id


@pytest.mark.parametrize("index", [V10, V8, V6, V5])
def test_a_frame_less_trace_is_no_stacktrace(index: int) -> None:
    headers = sample_headers(index)
    message = headers[h.EXCEPTION_MESSAGE]
    headers[h.EXCEPTION_STACK_TRACE] = f"System.Exception: {message}"

    title = g.classify(headers)[0].title

    assert title == "System.Exception: No stacktrace"


@pytest.mark.parametrize("trace", [None, "", "   ", "something other than a stack trace"])
def test_an_empty_or_unreadable_trace_is_no_stacktrace(trace: str | None) -> None:
    headers = sample_headers(V10) | {h.EXCEPTION_STACK_TRACE: trace}
    assert g.classify_exception_type_and_stack_trace(headers) == "System.Exception: No stacktrace"


def test_a_message_without_an_exception_type_is_still_grouped() -> None:
    minimal = {h.FAILED_Q: "Sales", h.MESSAGE_ID: "m-1"}
    groups = g.classify(minimal)
    assert (groups[0].classifier, groups[0].title) == (
        g.EXCEPTION_TYPE_AND_STACK_TRACE,
        ": No stacktrace",
    )
    assert groups[0].id == group_id(g.EXCEPTION_TYPE_AND_STACK_TRACE, ": No stacktrace")
    headers = sample_headers(V10)
    del headers[h.EXCEPTION_TYPE]
    assert g.classify(headers)[0].title == V10_TITLE.removeprefix("System.Exception")


def test_every_occurrence_of_the_message_is_removed_before_frames_are_read() -> None:
    # The message holds a frame-like line; it appears in the trace twice (the outer
    # exception's ToString repeats an inner one's message).
    message = "bad input\n   at Evil.Injected.Frame()"
    trace = (
        f"System.Exception: {message} ---> System.Exception: {message}\n"
        "   at Real.Type.Method()\n   --- End of inner exception stack trace ---\n"
        "   at Outer.Type.Method()"
    )
    title = g.exception_classification("System.Exception", message, trace)
    assert title == "System.Exception: Real.Type.Method()"
