"""The ``Exception Type and Python Frame`` classifier: one group per bug, whatever the
call depth, host or install path; a group per bug; and nothing for .NET traces."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlroom.errors import tracebacks
from controlroom.errors.ingest import grouping as g
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.identity import group_id
from controlroom.integrations import envelope
from tests.unit import V5, V6, V8, V10, sample_headers

TRACES = Path(__file__).parents[1] / "data" / "python_tracebacks"
HTTP_ERROR = "requests.exceptions.HTTPError"


def trace(name: str) -> str:
    return (TRACES / name).read_text(encoding="utf-8")


def failure(
    stack_trace: str, exception_type: str, message: str | None = None, host: str = "worker-1"
) -> dict[str, str | None]:
    message = message if message is not None else stack_trace.rstrip().rsplit(": ", 1)[-1]
    return {
        "NServiceBus.ExceptionInfo.ExceptionType": exception_type,
        "NServiceBus.ExceptionInfo.Message": message,
        "NServiceBus.ExceptionInfo.StackTrace": stack_trace,
        "NServiceBus.ProcessingMachine": host,
        "$.diagnostics.hostdisplayname": host,
        "Controlroom.TaskQueue": "celery",
    }


def python_group(headers: dict[str, str | None]) -> g.FailureGroup:
    (found,) = [
        group
        for group in g.classify(headers)
        if group.classifier == g.EXCEPTION_TYPE_AND_PYTHON_FRAME
    ]
    return found


def test_the_innermost_application_frame_names_the_group() -> None:
    title = g.classify_exception_type_and_python_frame(
        failure(trace("celery_http_error.txt"), HTTP_ERROR)
    )
    assert title == f"{HTTP_ERROR}: shop/payments.py in charge"


def test_same_bug_at_another_depth_host_and_install_path_is_one_group() -> None:
    container = python_group(failure(trace("celery_http_error.txt"), HTTP_ERROR, host="pod-7f9c"))
    ci = python_group(failure(trace("celery_http_error_other_host.txt"), HTTP_ERROR, host="ci-3"))
    assert container == ci
    assert container.id == group_id(g.EXCEPTION_TYPE_AND_PYTHON_FRAME, container.title)
    # ServiceControl's classifier, which keeps the absolute path, splits them.
    assert g.classify_exception_type_and_stack_trace(
        failure(trace("celery_http_error.txt"), HTTP_ERROR)
    ) != g.classify_exception_type_and_stack_trace(
        failure(trace("celery_http_error_other_host.txt"), HTTP_ERROR)
    )


def test_a_windows_path_is_read_with_slashes() -> None:
    windows = (
        trace("celery_http_error.txt")
        .replace("/app/shop/payments.py", "C:\\\\srv\\\\shop\\\\payments.py".replace("\\\\", "\\"))
        .replace("/usr/local/lib/python3.12/site-packages/", "C:\\Python312\\Lib\\site-packages\\")
    )
    assert g.classify_exception_type_and_python_frame(failure(windows, HTTP_ERROR)) == (
        f"{HTTP_ERROR}: shop/payments.py in charge"
    )


def test_the_standard_library_below_the_application_is_skipped() -> None:
    title = g.classify_exception_type_and_python_frame(
        failure(trace("dramatiq_json_error.txt"), "json.decoder.JSONDecodeError")
    )
    assert title == "json.decoder.JSONDecodeError: reports/storage.py in load_rows"


def test_a_chained_trace_groups_by_the_exception_that_escaped() -> None:
    title = g.classify_exception_type_and_python_frame(
        failure(trace("celery_chained_cause.txt"), "shop.errors.OutOfStock", "SKU-4411")
    )
    # The cause's frame (inventory.py) is not the task's failure: the last section is.
    assert title == "shop.errors.OutOfStock: shop/tasks.py in reserve_stock"


def test_without_an_application_frame_the_innermost_library_frame_is_used() -> None:
    title = g.classify_exception_type_and_python_frame(
        failure(trace("celery_library_only.txt"), "NotImplementedError")
    )
    assert title == "NotImplementedError: celery/app/task.py in run"


@pytest.mark.parametrize(
    ("exception_type", "changed"),
    [
        ("ValueError", trace("celery_http_error.txt")),  # another exception type
        (HTTP_ERROR, trace("celery_http_error.txt").replace("in charge", "in refund")),
        (HTTP_ERROR, trace("celery_http_error.txt").replace("shop/payments.py", "shop/ship.py")),
    ],
)
def test_different_bugs_are_different_groups(exception_type: str, changed: str) -> None:
    base = python_group(failure(trace("celery_http_error.txt"), HTTP_ERROR))
    assert python_group(failure(changed, exception_type)).id != base.id


def test_line_numbers_do_not_split_a_group() -> None:
    moved = (
        trace("celery_http_error.txt")
        .replace("line 88,", "line 93,")
        .replace("line 1024,", "line 1030,")
    )
    assert python_group(failure(moved, HTTP_ERROR)) == python_group(
        failure(trace("celery_http_error.txt"), HTTP_ERROR)
    )


def test_a_message_posing_as_a_section_or_a_frame_is_ignored() -> None:
    message = 'x\nTraceback (most recent call last):\n  File "/evil/inject.py", line 1, in evil'
    text = trace("celery_http_error.txt").rstrip() + message + "\n"
    title = g.classify_exception_type_and_python_frame(failure(text, HTTP_ERROR, message))
    assert title == f"{HTTP_ERROR}: shop/payments.py in charge"


@pytest.mark.parametrize("index", [V10, V8, V6, V5])
def test_dotnet_traces_get_no_python_group_and_the_same_five(index: int) -> None:
    headers = sample_headers(index)
    assert g.classify_exception_type_and_python_frame(headers) is None
    groups = g.classify(headers)
    assert [group.classifier for group in groups] == [c.name for c in g.SERVICECONTROL_CLASSIFIERS]


@pytest.mark.parametrize("message", ["1", "python3", "site-packages", "shop"])
def test_a_message_that_occurs_in_paths_changes_nothing(message: str) -> None:
    text = trace("dramatiq_json_error.txt").rsplit("\n", 2)[0] + f"\nValueError: {message}\n"
    title = g.classify_exception_type_and_python_frame(failure(text, "ValueError", message))
    assert title == "ValueError: reports/storage.py in load_rows"


def test_a_multi_line_message_with_a_forged_section_is_not_read() -> None:
    message = 'no\nTraceback (most recent call last):\n  File "/x/evil.py", line 1, in evil'
    text = trace("celery_http_error.txt").rsplit("\n", 2)[0] + f"\n{HTTP_ERROR}: {message}\n"
    title = g.classify_exception_type_and_python_frame(failure(text, HTTP_ERROR, message))
    assert title == f"{HTTP_ERROR}: shop/payments.py in charge"


def test_no_trace_or_no_frame() -> None:
    assert g.classify_exception_type_and_python_frame({}) is None
    headers = failure("Traceback (most recent call last):\nValueError: x\n", "ValueError", "x")
    assert g.classify_exception_type_and_python_frame(headers) == "ValueError: No stacktrace"


@pytest.mark.parametrize(
    ("path", "application", "stable"),
    [
        ("/app/shop/tasks.py", True, "shop/tasks.py"),
        ("tasks.py", True, "tasks.py"),
        ("/usr/lib/python3.11/json/decoder.py", False, "json/decoder.py"),
        ("/usr/lib64/python3.13t/asyncio/tasks.py", False, "asyncio/tasks.py"),
        ("/opt/pypy/lib/pypy3.10/json/decoder.py", False, "json/decoder.py"),
        ("/usr/lib/python3/dist-packages/kombu/utils.py", False, "kombu/utils.py"),
        ("/v/lib/python3.12/site-packages/celery/app/trace.py", False, "celery/app/trace.py"),
        ("C:\\Python312\\Lib\\json\\decoder.py", False, "json/decoder.py"),
        ("/usr/lib/python312.zip/json/decoder.py", False, "json/decoder.py"),
        ("<frozen importlib._bootstrap>", False, "<frozen importlib._bootstrap>"),
        ("<string>", False, "<string>"),
        ("/home/me/python-libs/shop/tasks.py", True, "shop/tasks.py"),
    ],
)
def test_library_and_stable_paths(path: str, application: bool, stable: str) -> None:
    assert tracebacks.is_application_path(path) is application
    assert tracebacks.stable_path(path) == stable


# --- property: generated tracebacks -------------------------------------------------------
_SEGMENT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=8)
MESSAGE = "1"  # a message that occurs in paths and line numbers too
_NAME = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)


def _site_packages(prefix: list[str], version: str) -> str:
    return "/" + "/".join([*prefix, "lib", f"python{version}", "site-packages"])


@st.composite
def generated_traceback(
    draw: st.DrawFn, package: str, module: str, function: str, message: str = MESSAGE
) -> str:
    """A Celery-like traceback whose innermost application frame is
    ``<root>/<package>/<module>.py in <function>``, with a random install root, Python
    version, number of worker and application frames above it and of library frames
    below it."""
    root = draw(st.lists(_SEGMENT.filter(lambda s: s not in {".", ".."}), max_size=5))
    version = draw(st.sampled_from(["3.10", "3.11", "3.12", "3.13"]))
    site = _site_packages(draw(st.lists(_SEGMENT, max_size=4)), version)
    stdlib = f"/usr/lib/python{version}"
    app_dir = "/" + "/".join([*root, package])
    lines = ["Traceback (most recent call last):"]

    def frame(path: str, name: str) -> None:
        number = draw(st.integers(1, 5000))
        lines.append(f'  File "{path}", line {number}, in {name}')
        lines.append(f"    {name}()")
        if draw(st.booleans()):
            lines.append("    ^^^^^^")

    for _ in range(draw(st.integers(0, 4))):  # the worker's own frames
        frame(f"{site}/{draw(_NAME)}/{draw(_NAME)}.py", draw(_NAME))
    for _ in range(draw(st.integers(0, 4))):  # application frames that called the bug
        frame(f"{app_dir}/{draw(_NAME)}.py", draw(_NAME))
    frame(f"{app_dir}/{module}.py", function)
    for _ in range(draw(st.integers(0, 4))):  # libraries and stdlib it called
        library = draw(st.sampled_from([site, stdlib, "<frozen importlib._bootstrap>"]))
        frame(f"{library}/{draw(_NAME)}.py" if library[0] == "/" else library, draw(_NAME))
    lines.append(f"ValueError: {message}")
    return "\n".join(lines) + "\n"


@given(_NAME, _NAME, _NAME, st.data())
def test_generated_tracebacks_group_by_the_application_frame(
    package: str, module: str, function: str, data: st.DataObject
) -> None:
    first = data.draw(generated_traceback(package, module, function))
    second = data.draw(generated_traceback(package, module, function))
    expected = f"ValueError: {package}/{module}.py in {function}"
    for text in (first, second):
        title = g.classify_exception_type_and_python_frame(failure(text, "ValueError", MESSAGE))
        assert title == expected


@given(st.tuples(_NAME, _NAME, _NAME), st.tuples(_NAME, _NAME, _NAME), st.data())
def test_generated_tracebacks_of_different_bugs_are_different_groups(
    bug: tuple[str, str, str], other: tuple[str, str, str], data: st.DataObject
) -> None:
    first = python_group(failure(data.draw(generated_traceback(*bug)), "ValueError", MESSAGE))
    second = python_group(failure(data.draw(generated_traceback(*other)), "ValueError", MESSAGE))
    assert (first.id == second.id) == (bug == other)


@given(st.text(alphabet='Traceback (mostrcniafl):\n File",012/|^<>', max_size=400))
def test_any_text_gives_none_or_a_bounded_title(text: str) -> None:
    title = g.classify_exception_type_and_python_frame(failure(text, "E", ""))
    assert title is None or title.startswith("E: ")
    assert (title is None) == (not tracebacks.is_python_traceback(text))


@pytest.mark.timeout(30)  # a hang guard, not a speed assertion
@pytest.mark.parametrize(
    "text",
    [
        "Traceback (most recent call last):\n" + "x Traceback (most recent call last):" * 30_000,
        "Traceback (most recent call last):\n" + "  Traceback (most recent call last): " * 30_000,
        "Traceback (most recent call last):\n" + '  File "/a/b.py", line 1, in f\n' * 50_000,
        'Traceback (most recent call last):\n  File "/lib/python3' + "1" * 1_000_000,
        "Traceback (most recent call last):\n" + "    x\n" * 200_000,
    ],
)
def test_hostile_tracebacks_finish(text: str) -> None:
    g.classify(failure(text, "E", "m"))
    tracebacks.parse_traceback(text)


# --- Python Task Queue --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "title"),
    [
        ("celery", "celery"),
        ("dramatiq", "dramatiq"),
        (" Celery ", "celery"),
        ("rq", None),
        ("", None),
    ],
)
def test_the_task_queue_classifier(value: str, title: str | None) -> None:
    assert g.classify_python_task_queue({"Controlroom.TaskQueue": value}) == title
    assert g.classify_python_task_queue({}) is None


# --- as the integrations capture a failure ------------------------------------------------
def _ping(depth: int) -> None:
    if depth == 0:
        innermost_bug()
    _pong(depth - 1)


def _pong(depth: int) -> None:
    _ping(depth)


def innermost_bug() -> None:
    raise LookupError("no such order: 1")


def captured(depth: int) -> dict[str, str | None]:
    try:
        try:
            _ping(depth)
        except LookupError as exc:
            raise RuntimeError("charge failed") from exc
    except RuntimeError as exc:
        failure = envelope.capture_failure(exc)
    return envelope.failed_message_headers(
        kind="celery",
        task_id="t-1",
        task_name="shop.tasks.charge",
        queue="celery",
        endpoint="shop",
        host="worker-1",
        failure=failure,
        time_of_failure=datetime.now(UTC),
    )


def test_the_header_name_is_the_integrations() -> None:
    assert envelope.TASK_QUEUE == h.TASK_QUEUE
    assert set(envelope.KINDS) == set(h.TASK_QUEUE_KINDS)


@pytest.mark.parametrize("depth", [3, 400])  # 400: the traceback is cut in its middle
def test_a_failure_captured_by_the_envelope_is_grouped_by_its_frame(depth: int) -> None:
    headers = captured(depth)
    trace = headers[h.EXCEPTION_STACK_TRACE]
    assert trace is not None
    assert ("characters cut" in trace) == (depth > 100)
    titles = {group.classifier: group.title for group in g.classify(headers)}
    # The escaping exception is the RuntimeError, raised in captured(): not the cause.
    assert titles[g.EXCEPTION_TYPE_AND_PYTHON_FRAME] == (
        "RuntimeError: unit/test_python_grouping.py in captured"
    )
    assert titles[g.PYTHON_TASK_QUEUE] == "celery"
    parsed = tracebacks.parse_traceback(trace)
    assert parsed is not None
    cause = parsed.sections[0]
    assert cause.text.startswith("LookupError: no such order: 1")
    assert cause.frames[-1].function == "innermost_bug"


def test_a_cut_inside_a_frame_line_is_read_past() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/app/shop/a.py", line 1, in outer\n    inner()\n  File "/app/sh\n'
        "... 5000 characters cut ...\n"
        'op/c.py", line 7, in middle\n    x()\n'
        '  File "/app/shop/b.py", line 9, in innermost\n    raise KeyError(1)\n'
        "KeyError: 1\n"
    )
    headers = failure(text, "KeyError", "1")
    assert g.classify_exception_type_and_python_frame(headers) == "KeyError: shop/b.py in innermost"
    parsed = tracebacks.parse_traceback(text)
    assert parsed is not None
    assert [frame.function for frame in parsed.sections[0].frames] == ["outer", "innermost"]


def test_a_cut_in_the_last_section_is_read_past() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/app/shop/a.py", line 1, in outer\n    inner()\n'
        "... 5000 characters cut ...\n"
        "ne 7, in middle\n    x()\n"
        '  File "/app/shop/b.py", line 9, in innermost\n    raise KeyError(1)\n'
        '  File "/usr/lib/python3.12/json/decoder.py", line 3, in f\n    y()\n'
        "KeyError: 1\n"
    )
    headers = failure(text, "KeyError", "1")
    assert g.classify_exception_type_and_python_frame(headers) == "KeyError: shop/b.py in innermost"
    parsed = tracebacks.parse_traceback(text)
    assert parsed is not None
    (section,) = parsed.sections
    assert [frame.function for frame in section.frames] == ["outer", "innermost", "f"]
    assert section.frames[0].source == "inner()\n... 5000 characters cut ...\nne 7, in middle\nx()"
    assert section.text == "KeyError: 1"
