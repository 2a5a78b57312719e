"""Failure classifiers: names, order, titles on real traces, and linear time on hostile input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlroom.errors.ingest import grouping as g
from controlroom.errors.ingest.identity import group_id
from tests.unit import V5, V6, V8, V10, sample_headers

DOTNET_HANDLER = (
    "Core.Headers.Writers.HeaderWriterError.MessageHandler.Handle"
    "(MessageToSend message, IMessageHandlerContext context)"
)


def _exception(
    stack_trace: str | None, exception_type: str = "System.Exception", message: str = "boom"
) -> dict[str, str | None]:
    return {
        "NServiceBus.ExceptionInfo.ExceptionType": exception_type,
        "NServiceBus.ExceptionInfo.Message": message,
        "NServiceBus.ExceptionInfo.StackTrace": stack_trace,
    }


def test_classifier_names_and_order_are_servicecontrols() -> None:
    assert [c.name for c in g.SERVICECONTROL_CLASSIFIERS] == [
        "Exception Type and Stack Trace",
        "Message Type",
        "Endpoint Address",
        "Endpoint Instance",
        "Endpoint Name",
    ]
    # Controlroom's own classifier comes after ServiceControl's, which keep their order.
    assert [c.name for c in g.CLASSIFIERS] == [
        *(c.name for c in g.SERVICECONTROL_CLASSIFIERS),
        "Exception Type and Python Frame",
        "Python Task Queue",
    ]


def test_classify_the_nservicebus_10_sample() -> None:
    groups = g.classify(sample_headers(V10))
    assert [(group.classifier, group.title) for group in groups] == [
        ("Exception Type and Stack Trace", f"System.Exception: {DOTNET_HANDLER}"),
        ("Message Type", "Core.Headers.Writers.MyNamespace.MessageToSend"),
        ("Endpoint Address", "HeaderWriterError"),
        ("Endpoint Instance", "daaf5ebc8d6a51b7b0dccdd8b15c3626"),
        ("Endpoint Name", "HeaderWriterError"),
    ]
    for group in groups:
        assert group.id == group_id(group.classifier, group.title)


def test_v8_and_v10_samples_share_the_exception_group() -> None:
    first = g.classify(sample_headers(V10))[0]
    assert g.classify(sample_headers(V8))[0] == first


def test_v6_async_trace_takes_the_handler_frame() -> None:
    title = g.classify_exception_type_and_stack_trace(sample_headers(V6))
    assert title == (
        "System.Exception: Core6.Headers.Writers.HeaderWriterError.MessageHandler.Handle"
        "(MessageToSend message, IMessageHandlerContext context)"
    )


def test_v5_sample_groups_by_failed_queue_and_its_endpoint() -> None:
    titles = {group.classifier: group.title for group in g.classify(sample_headers(V5))}
    assert titles["Endpoint Address"] == "HeaderWriterErrorV5@MACHINENAME"
    assert titles["Endpoint Name"] == "HeaderWriterErrorV5"
    assert titles["Exception Type and Stack Trace"] == (
        "System.Exception: Core5.Headers.Writers.HeaderWriterError.MessageHandler.Handle"
        "(MessageToSend message)"
    )


# --- .NET traces --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "frame_line",
    [
        "   at Ns.Type.Method(String a, Int32 b) in C:\\src\\Type.cs:line 42",
        "   at Ns.Type.Method(String a, Int32 b) in /src/Type.cs:line 42",
        "at Ns.Type.Method(String a, Int32 b)",
        "\tat Ns.Type.Method (String a, Int32 b)\r",
    ],
)
def test_dotnet_frame_is_type_method_params_without_file(frame_line: str) -> None:
    trace = f"System.InvalidOperationException: boom\n{frame_line}\n   at Other.Caller.Run()"
    title = g.classify_exception_type_and_stack_trace(
        _exception(trace, "System.InvalidOperationException")
    )
    assert title == "System.InvalidOperationException: Ns.Type.Method(String a, Int32 b)"


def test_inner_exception_trace_takes_the_first_frame_listed() -> None:
    # ServiceControl's own test case, shortened: the innermost exception's frames come first.
    trace = (
        "System.InvalidOperationException: Handler was not found.\n"
        "Container not configured. ---> Autofac.Core.DependencyResolutionException: "
        "Cannot resolve parameter 'NHibernate.ISession session' of constructor "
        "'Void .ctor(NHibernate.ISession)'.\n"
        "   at Autofac.Core.Activators.Reflection.ReflectionActivator.ActivateInstance"
        "(IComponentContext context, IEnumerable`1 parameters)\n"
        "   at Autofac.Core.Resolving.InstanceLookup.Activate(IEnumerable`1 parameters)\n"
        "   --- End of inner exception stack trace ---"
    )
    assert g.exception_classification("exceptionType", None, trace) == (
        "exceptionType: Autofac.Core.Activators.Reflection.ReflectionActivator.ActivateInstance"
        "(IComponentContext context, IEnumerable`1 parameters)"
    )


def test_constructor_and_generic_frames() -> None:
    trace = "   at Ns.Type..ctor(Int32 x)\n"
    assert g.exception_classification("E", None, trace) == "E: Ns.Type..ctor(Int32 x)"
    trace = "   at NServiceBus.Pipeline.PipelineExecutor.Execute[T](BehaviorChain1 a, T b)"
    assert g.exception_classification("E", None, trace) == (
        "E: NServiceBus.Pipeline.PipelineExecutor.Execute[T](BehaviorChain1 a, T b)"
    )


def test_a_frame_like_line_inside_the_message_is_skipped() -> None:
    message = "bad input\nat Evil.Injected.Frame()"
    trace = f"System.Exception: {message}\n   at Real.Type.Method()"
    assert g.exception_classification("System.Exception", message, trace) == (
        "System.Exception: Real.Type.Method()"
    )


def test_prose_starting_with_at_is_not_a_frame() -> None:
    trace = "System.Exception: x\nat least one (1) item is required\n   at Real.Type.Method()"
    assert g.exception_classification("System.Exception", "other message", trace) == (
        "System.Exception: Real.Type.Method()"
    )


@pytest.mark.parametrize("trace", [None, "", "   ", "something other than a normal stack trace"])
def test_no_frame_groups_by_exception_type_with_servicecontrols_suffix(trace: str | None) -> None:
    assert g.classify_exception_type_and_stack_trace(_exception(trace)) == (
        "System.Exception: No stacktrace"
    )


def test_no_exception_type_is_still_an_exception_group() -> None:
    assert g.classify_exception_type_and_stack_trace({}) == ": No stacktrace"
    headers = _exception("   at A.B()", exception_type="")
    assert g.classify_exception_type_and_stack_trace(headers) == ": A.B()"


# --- Python tracebacks --------------------------------------------------------------------
PYTHON_TRACE = """Traceback (most recent call last):
  File "/app/worker.py", line 88, in run
    handle(message)
  File "/app/orders/handlers.py", line 12, in handle
    raise ValueError(f"bad order {order_id}")
ValueError: bad order 7
"""


def test_python_trace_takes_the_innermost_frame_without_line_number() -> None:
    headers = _exception(PYTHON_TRACE, exception_type="ValueError", message="bad order 7")
    assert g.classify_exception_type_and_stack_trace(headers) == (
        "ValueError: /app/orders/handlers.py in handle"
    )


def test_python_line_numbers_do_not_split_groups() -> None:
    moved = PYTHON_TRACE.replace("line 12", "line 14")
    assert g.exception_classification("ValueError", None, moved) == g.exception_classification(
        "ValueError", None, PYTHON_TRACE
    )


def test_python_chained_trace_takes_the_escaping_exceptions_innermost_frame() -> None:
    trace = (
        PYTHON_TRACE
        + "\nDuring handling of the above exception, another exception occurred:\n\n"
        + 'Traceback (most recent call last):\n  File "/app/worker.py", line 90, in run\n'
        + '    log(exc)\n  File "/app/log.py", line 3, in log\n    raise OSError("disk")\n'
        + "OSError: disk\n"
    )
    assert g.exception_classification("OSError", "disk", trace) == "OSError: /app/log.py in log"


def test_python_frame_like_text_in_the_trailing_message_is_skipped() -> None:
    message = 'oops\n  File "/evil.py", line 1, in injected'
    trace = PYTHON_TRACE.replace("bad order 7", message)
    assert g.exception_classification("ValueError", message, trace) == (
        "ValueError: /app/orders/handlers.py in handle"
    )


# --- the other classifiers ----------------------------------------------------------------
def test_endpoint_instance_prefers_the_metric_instance_id() -> None:
    headers = sample_headers(V10) | {"NServiceBus.Metric.InstanceId": "sales-1"}
    assert g.classify_endpoint_instance(headers) == "sales-1"


@pytest.mark.parametrize(
    ("host_id", "expected"),
    [
        ("DAAF5EBC-8D6A-51B7-B0DC-CDD8B15C3626", "daaf5ebc8d6a51b7b0dccdd8b15c3626"),
        ("custom-host", "custom-host"),
        (None, None),
    ],
)
def test_endpoint_instance_is_the_host_id_in_n_form(
    host_id: str | None, expected: str | None
) -> None:
    assert g.classify_endpoint_instance({"$.diagnostics.hostid": host_id}) == expected


def test_no_headers_only_the_exception_group() -> None:
    assert [group.title for group in g.classify({})] == [": No stacktrace"]


# --- bounded titles and linear time -------------------------------------------------------
def test_long_titles_are_cut_and_the_id_hashes_the_cut_title() -> None:
    headers = _exception(None, exception_type="E" * 5000) | {
        "NServiceBus.EnclosedMessageTypes": "é" * 5000
    }
    for group in g.classify(headers):
        assert len(group.title) == g.MAX_TITLE_LENGTH
        assert group.id == group_id(group.classifier, group.title)


def test_titles_are_storable() -> None:
    headers = {"NServiceBus.FailedQ": "q\x00ueue", "NServiceBus.EnclosedMessageTypes": "T\udc80"}
    titles = [group.title for group in g.classify(headers)]
    assert titles == [": No stacktrace", "T\ufffd", "q\ufffdueue", "q\ufffdueue"]


XML_MB = "<order><line>" + "<item a='1'>x</item>" * 52_000 + "</line></order>"


@pytest.mark.timeout(30)  # a hang guard, not a speed assertion
@pytest.mark.parametrize(
    "trace",
    [
        f"System.Exception: {XML_MB}\n   at A.B.C()",  # 1 MB message, one line, then a frame
        XML_MB,  # 1 MB, no newline, no frame
        "at X." + "(" * 1_000_000,  # open parens and no close
        "at " + "a." * 500_000 + "(",  # dots without end
        "\n".join(["   at"] * 10_000 + ["   at A.B.C()"]),  # the frame is the 10,001st line
        "\n".join(f"   at Ns.T{i}.M{i}(Int32 x) in /s/f.cs:line {i}" for i in range(10_000)),
        "Traceback (most recent call last):\n" + '  File "' * 200_000,
        "Traceback (most recent call last):\n"
        + "\n".join(f'  File "/a/m{i}.py", line {i}, in f{i}\n    x()' for i in range(10_000))
        + f"\nValueError: {XML_MB}",
    ],
)
def test_hostile_traces_finish_and_titles_stay_bounded(trace: str) -> None:
    headers = _exception(trace, message=XML_MB) | {"NServiceBus.FailedQ": XML_MB}
    groups = g.classify(headers)
    assert groups
    assert all(len(group.title) <= g.MAX_TITLE_LENGTH for group in groups)


@given(st.text(alphabet='at .()\n\r\t"File,line0in', max_size=300), st.text(max_size=30))
def test_any_trace_gives_a_bounded_title(trace: str, message: str) -> None:
    title = g.exception_classification("E", message, trace)
    assert title is not None
    assert title.startswith("E: ")


def test_a_ten_thousand_line_dotnet_trace_stops_at_its_first_frame() -> None:
    trace = "\n".join(f"   at Ns.T{i}.M{i}(Int32 x) in /s/f.cs:line {i}" for i in range(10_000))
    assert g.exception_classification("E", None, trace) == "E: Ns.T0.M0(Int32 x)"
    late = "\n".join(["   at"] * 10_000 + ["   at A.B.C()"])
    assert g.exception_classification("E", None, late) == "E: A.B.C()"


def test_a_ten_thousand_frame_python_trace_with_a_1_mb_message() -> None:
    trace = (
        "Traceback (most recent call last):\n"
        + "\n".join(f'  File "/a/m{i}.py", line {i}, in f{i}\n    x()' for i in range(10_000))
        + f"\nValueError: {XML_MB}\n"
    )
    assert g.exception_classification("ValueError", XML_MB, trace) == (
        "ValueError: /a/m9999.py in f9999"
    )
