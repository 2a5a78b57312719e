"""Python tracebacks read as frames (errors/tracebacks.py) and a task's arguments read
from its body (errors/tasks.py, web/bodies.py): real tracebacks, every line kept, bounded
work on hostile text."""

from __future__ import annotations

import json
import traceback

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlroom.errors import tracebacks as t
from controlroom.errors.tasks import task_arguments
from controlroom.web.bodies import view_body
from tests.python_tasks import celery_body, dramatiq_body, sample_traceback


def _raise_chained() -> None:
    try:
        {}["missing"]
    except KeyError as exc:
        raise ValueError("bad order") from exc


def test_a_real_chained_traceback_is_read_as_two_sections() -> None:
    try:
        _raise_chained()
    except ValueError as exc:
        text = "".join(traceback.format_exception(exc))
    parsed = t.parse_traceback(text)
    assert parsed is not None
    cause, escaped = parsed.sections
    assert cause.text.startswith("KeyError: 'missing'")
    assert "direct cause" in cause.text
    assert escaped.text == "ValueError: bad order"
    assert [frame.function for frame in escaped.frames][-1] == "_raise_chained"
    assert all(frame.path == __file__ for frame in cause.frames + escaped.frames)
    assert all(frame.application for frame in escaped.frames[-1:])


def test_the_celery_sample_frames_sources_and_markers() -> None:
    parsed = t.parse_traceback(sample_traceback("celery_http_error.txt"))
    assert parsed is not None
    (section,) = parsed.sections
    assert [(f.short_path, f.line, f.function, f.application) for f in section.frames] == [
        ("celery/app/trace.py", 453, "trace_task", False),
        ("celery/app/trace.py", 736, "__protected_call__", False),
        ("shop/tasks.py", 41, "charge_card", True),
        ("shop/payments.py", 88, "charge", True),
        ("requests/models.py", 1024, "raise_for_status", False),
    ]
    # The ^^^ markers are left out; the source line is kept.
    assert section.frames[0].source == "R = retval = fun(*args, **kwargs)"
    assert section.text.startswith("requests.exceptions.HTTPError: 402")
    runs = t.frame_runs(section.frames)
    assert [(run.application, len(run.frames)) for run in runs] == [
        (False, 2),
        (True, 2),
        (False, 1),
    ]


def test_a_recursion_note_joins_its_frame() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/app/r.py", line 2, in f\n    return f()\n'
        "  [Previous line repeated 996 more times]\n"
        '  File "/app/r.py", line 3, in g\n    raise RecursionError\n'
        "RecursionError: maximum recursion depth exceeded\n"
    )
    parsed = t.parse_traceback(text)
    assert parsed is not None
    first, second = parsed.sections[0].frames
    assert first.source == "return f()\n[Previous line repeated 996 more times]"
    assert second.function == "g"


def test_not_a_python_traceback() -> None:
    assert t.parse_traceback("System.Exception: x\n   at A.B()") is None
    assert not t.is_python_traceback(None)
    assert t.frame_runs(()) == ()


@given(st.text(alphabet='Traceback (mostrcniafl):\n File",0123/|^<>[] ', max_size=500))
def test_every_line_but_headers_and_markers_is_kept(text: str) -> None:
    parsed = t.parse_traceback("Traceback (most recent call last):\n" + text)
    assert parsed is not None
    kept = [parsed.preamble] + [
        part
        for section in parsed.sections
        for part in [
            *(
                f'File "{f.path}", line {f.line}, in {f.function}\n{f.source}'
                for f in section.frames
            ),
            section.text,
        ]
    ]
    joined = "\n".join(kept)
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and stripped != t.TRACEBACK_HEADER and not set(stripped) <= set("^~ "):
            assert stripped in joined


# --- a task's arguments -------------------------------------------------------------------
def test_celery_arguments() -> None:
    body = celery_body(["order-1", 5], {"currency": "EUR", "items": [1, 2]}).decode()
    found = task_arguments("celery", body)
    assert found is not None
    assert found.args == ('"order-1"', "5")
    assert found.kwargs == (("currency", '"EUR"'), ("items", "[\n  1,\n  2\n]"))


def test_dramatiq_arguments() -> None:
    body = dramatiq_body("m-1", "build_report", ["q3"], {"région": "emea"}).decode()
    found = task_arguments("dramatiq", body)
    assert found is not None
    assert found.args == ('"q3"',)
    assert found.kwargs == (("région", '"emea"'),)


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("celery", '{"args": []}'),  # not protocol 2's list
        ("celery", "[[], {}]"),  # two parts
        ("celery", "[{}, {}, null]"),  # args not a list
        ("celery", "not json"),
        ("dramatiq", "[[], {}, null]"),
        ("dramatiq", '{"actor_name": "a", "args": []}'),  # no queue_name
        (None, "[[], {}, null]"),  # not a task
        ("rq", "[[], {}, null]"),
    ],
)
def test_other_shapes_have_no_arguments(kind: str | None, body: str) -> None:
    assert task_arguments(kind, body) is None


def test_the_body_view_gives_arguments_only_for_a_task_queue() -> None:
    data = celery_body(["a"], {})
    view = view_body(data, "application/json", None, "celery")
    assert view.arguments is not None and view.arguments.args == ('"a"',)
    assert view.text == json.dumps(json.loads(data), indent=2)
    assert view_body(data, "application/json", None).arguments is None
    # A body not labelled JSON is not read for arguments.
    assert view_body(data, "application/octet-stream", None, "celery").arguments is None


def test_a_message_posing_as_a_traceback_is_the_escaping_sections_text_not_a_section() -> None:
    # The grouping reads past the message (escaping_frame); the frames shown must too,
    # else the console and the API show a frame the exception never passed through.
    message = (
        "boom\nTraceback (most recent call last):\n"
        '  File "/app/evil/forged.py", line 1, in forged\nEvil: x'
    )
    trace = (
        "Traceback (most recent call last):\n"
        '  File "/app/shop/tasks.py", line 3, in charge\n'
        "    x()\n"
        f"ValueError: {message}\n"
    )
    parsed = t.parse_traceback(trace, message)
    assert parsed is not None
    (section,) = parsed.sections
    assert [frame.function for frame in section.frames] == ["charge"]
    assert section.text == f"ValueError: {message}"
    assert t.escaping_frame(trace, message) == ("shop/tasks.py", "charge")
