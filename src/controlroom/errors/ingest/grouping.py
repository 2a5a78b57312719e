"""Failure classifiers: which groups a failed message belongs to (pure, no I/O).

ServiceControl's five classifiers, in its registration order and with its names (the
names are part of every group id): ``Exception Type and Stack Trace``, ``Message Type``,
``Endpoint Address``, ``Endpoint Instance``, ``Endpoint Name``; then Controlroom's own:
``Exception Type and Python Frame``, which groups only Python tracebacks (docs/decisions.md
"Python frames are grouped by module tail and function"), and ``Python Task Queue``, which
groups failed Celery and Dramatiq tasks by their task queue (docs/decisions.md "The Python
task facet is a classifier"). Each is a function of the
attempt's headers returning the classification (the group title) or ``None`` (no group).
Group id = ``identity.group_id(classifier name, title)``. Source: ServiceControl
``Recoverability/Grouping/Groupers`` and docs/design.md "Identity".

Every classifier is linear in the size of the headers: the exception message is removed
with one ``str.replace``, the stack trace is scanned line by line with ``str.find``, never
with a regular expression over the whole trace, and a .NET trace stops at its first frame.
Titles are cut to ``MAX_TITLE_LENGTH`` code points (Python ``str`` slicing never splits a
code point; it can split a grapheme of several code points).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from controlroom.errors import tracebacks
from controlroom.errors.ingest import headers as h
from controlroom.errors.ingest.identity import group_id
from controlroom.errors.model import FailureGroup, Headers

EXCEPTION_TYPE_AND_STACK_TRACE = "Exception Type and Stack Trace"
MESSAGE_TYPE = "Message Type"
ENDPOINT_ADDRESS = "Endpoint Address"
ENDPOINT_INSTANCE = "Endpoint Instance"
ENDPOINT_NAME = "Endpoint Name"
EXCEPTION_TYPE_AND_PYTHON_FRAME = "Exception Type and Python Frame"
PYTHON_TASK_QUEUE = "Python Task Queue"
CAUSE_CLASSIFIERS = frozenset({EXCEPTION_TYPE_AND_STACK_TRACE, EXCEPTION_TYPE_AND_PYTHON_FRAME})
"""The classifiers whose groups are causes of failure (the others group by where or
what failed): a new group of theirs is a ``FailureGroupAppeared`` event."""

MAX_TITLE_LENGTH = 1000
"""Longest group title, in code points. Longer classifications are cut (ids hash the cut title)."""

_NO_FRAME = "No stacktrace"  # ServiceControl's (6.15 and later) title suffix without a frame
_PYTHON_TRACEBACK = "Traceback (most recent call last):"
# One Python frame line, applied only to a single stripped line that starts with 'File "'.
# [^"]* cannot cross the closing quote, so matching is linear in the line.
_PYTHON_FRAME_RE = re.compile(r'File "([^"]*)", line [0-9]+, in (.+)')
_TRAILING_SPACE = " \t\r\n"


@dataclass(frozen=True, slots=True)
class Classifier:
    """A named failure classifier: ``classify(headers)`` is the group title or ``None``."""

    name: str
    classify: Callable[[Headers], str | None]


# --- Exception Type and Stack Trace -------------------------------------------------------
def classify_exception_type_and_stack_trace(headers: Headers) -> str:
    """``"<exception type>: <first stack frame>"``, ``"<exception type>: No stacktrace"``
    without a frame. A message without ``NServiceBus.ExceptionInfo.ExceptionType`` is
    grouped too, with an empty type (``": No stacktrace"`` for a message with no
    exception headers at all), as ServiceControl groups it. See
    ``exception_classification`` for the frame rules.
    """
    return exception_classification(
        h.header_text(headers, h.EXCEPTION_TYPE),
        headers.get(h.EXCEPTION_MESSAGE),
        headers.get(h.EXCEPTION_STACK_TRACE),
    )


def exception_classification(
    exception_type: str | None, message: str | None, stack_trace: str | None
) -> str:
    """The ``Exception Type and Stack Trace`` title from the three exception headers.

    ``exception_type + ": " + frame`` where ``frame`` is ``first_frame(stack_trace)``;
    ``exception_type + ": No stacktrace"`` when the trace is empty or has no recognisable
    frame; a missing type reads as empty. Source: ServiceControl 6.15
    ``ExceptionTypeAndStackTraceFailureClassifier`` (titles, and so group ids, match).
    """
    frame = first_frame(stack_trace, exception_type, message) if stack_trace else None
    return f"{exception_type or ''}: {frame if frame is not None else _NO_FRAME}"


def first_frame(stack_trace: str, exception_type: str | None, message: str | None) -> str | None:
    """The frame that identifies where the exception was thrown, or ``None``.

    Every occurrence of the exception ``message`` is removed from the trace first (as
    ServiceControl does), so message text that happens to look like a frame is not taken
    for one. Then:

    * .NET (``Exception.ToString()``): the first line that, stripped, is a word (``at``, or
      its translation in a localized trace: ``bei``, ``à``, ``en``, ...), white space, and
      ``Namespace.Type.Method(params)``, optionally followed by `` in file:line N``; the
      frame is ``Namespace.Type.Method(params)`` exactly as written, as in ServiceControl.
      .NET lists the throw site first (and, with inner exceptions, the innermost
      exception's frames first). Scanning stops at that line.
    * Python (the trace starts with ``Traceback (most recent call last):``; Controlroom's
      own extension): Python lists the throw site *last*, so the equivalent is the last
      ``File "path", line N, in func`` line (with chained exceptions: of the exception
      that escaped); the frame is ``"path in func"``. The line number is left out (it
      moves with every edit, which would split one failure into many groups), as
      ServiceControl leaves out .NET's.
    """
    trace = stack_trace.replace(message, "") if message else stack_trace
    if trace.startswith(_PYTHON_TRACEBACK, len(trace) - len(trace.lstrip())):
        return _last_python_frame(trace, len(trace.rstrip(_TRAILING_SPACE)))
    return _first_dotnet_frame(trace, 0)


def _first_dotnet_frame(trace: str, start: int) -> str | None:
    pos = start
    while pos < len(trace):
        end = trace.find("\n", pos)
        if end == -1:
            end = len(trace)
        frame = _dotnet_frame(trace[pos:end])
        if frame is not None:
            return frame
        pos = end + 1
    return None


def _dotnet_frame(line: str) -> str | None:
    """``Type.Method(params)`` of one ``<word> ...`` line, or ``None`` if it is not a frame.

    The word is any run of word characters (StackTraceParser's ``\\w+``: .NET writes
    ``at`` in its UI culture's language) followed by white space."""
    text = line.strip()
    word_end = 0
    while word_end < len(text) and (text[word_end].isalnum() or text[word_end] == "_"):
        word_end += 1
    if word_end == 0 or word_end == len(text) or not text[word_end].isspace():
        return None
    text = text[word_end:].lstrip()
    open_paren = text.find("(")
    if open_paren == -1:
        return None
    name = text[:open_paren].rstrip()  # ServiceControl allows space before "("; drops it
    # A method name is "Type.Method" with no white space: prose such as "at least one (x)"
    # in an exception message is not a frame.
    dot = name.rfind(".")
    if dot <= 0 or dot == len(name) - 1 or any(c.isspace() for c in name):
        return None
    close_paren = text.find(")", open_paren)
    if close_paren == -1:
        return None
    return name + text[open_paren : close_paren + 1]


def _last_python_frame(trace: str, end: int) -> str | None:
    pos = end
    while True:
        start = trace.rfind("\n", 0, pos) + 1
        frame = _python_frame(trace[start:pos])
        if frame is not None:
            return frame
        if start == 0:
            return None
        pos = start - 1


def _python_frame(line: str) -> str | None:
    text = line.strip()
    if not text.startswith('File "'):
        return None
    match = _PYTHON_FRAME_RE.fullmatch(text)
    if match is None:
        return None
    path, function = match.groups()
    return f"{path} in {function}"


# --- Exception Type and Python Frame ------------------------------------------------------
def classify_exception_type_and_python_frame(headers: Headers) -> str | None:
    """``"<exception type>: <module tail> in <function>"`` of a Python traceback, ``None``
    for any other stack trace (a .NET trace gets no group from this classifier).

    The frame is ``tracebacks.escaping_frame``'s: in the last section (the exception that
    escaped, after its chained causes), the innermost frame of the application's own code
    (standard library and installed packages skipped), else the innermost frame; its file
    as ``tracebacks.stable_path`` gives it, no line number (docs/decisions.md "Python frames
    are grouped by module tail and function"). The exception message is not searched for
    frames or sections (``escaping_frame``), so it cannot pose as one.
    ``"<exception type>: No stacktrace"`` for a traceback without a frame.
    """
    trace = headers.get(h.EXCEPTION_STACK_TRACE)
    if trace is None or not tracebacks.is_python_traceback(trace):
        return None
    exception_type = h.header_text(headers, h.EXCEPTION_TYPE) or ""
    frame = tracebacks.escaping_frame(trace, headers.get(h.EXCEPTION_MESSAGE))
    if frame is None:
        return f"{exception_type}: {_NO_FRAME}"
    path, function = frame
    return f"{exception_type}: {path} in {function}"


# --- Python Task Queue --------------------------------------------------------------------
def classify_python_task_queue(headers: Headers) -> str | None:
    """``celery`` or ``dramatiq``: the ``Controlroom.TaskQueue`` header of a failed Python
    task (``headers.task_queue``), ``None`` for any other message."""
    return h.task_queue(headers)


# --- the other four -----------------------------------------------------------------------
def classify_message_type(headers: Headers) -> str | None:
    """The message type (first part of ``NServiceBus.EnclosedMessageTypes``)."""
    return h.message_type(headers)


def classify_endpoint_address(headers: Headers) -> str | None:
    """The failed queue's address, ``NServiceBus.FailedQ`` as written (``queue@machine``)."""
    return h.header_text(headers, h.FAILED_Q)


def classify_endpoint_instance(headers: Headers) -> str | None:
    """The endpoint instance: ``NServiceBus.Metric.InstanceId`` when present, else the
    processing host id in .NET "N" form (32 lower-case hex digits, as ServiceControl's
    ``HostId.ToString("N")``; a non-GUID host id as written). ``None`` without either:
    ServiceControl would group such messages under the all-zero GUID, which says nothing.
    """
    instance_id = h.header_text(headers, h.METRIC_INSTANCE_ID)
    if instance_id is not None:
        return instance_id
    raw = h.header_text(headers, h.HOST_ID)
    if raw is None:
        return None
    guid = h.parse_guid(raw)
    return guid.replace("-", "") if guid is not None else raw


def classify_endpoint_name(headers: Headers) -> str | None:
    """The processing endpoint's name (``headers.processing_endpoint``)."""
    return h.processing_endpoint(headers)


SERVICECONTROL_CLASSIFIERS: tuple[Classifier, ...] = (
    Classifier(EXCEPTION_TYPE_AND_STACK_TRACE, classify_exception_type_and_stack_trace),
    Classifier(MESSAGE_TYPE, classify_message_type),
    Classifier(ENDPOINT_ADDRESS, classify_endpoint_address),
    Classifier(ENDPOINT_INSTANCE, classify_endpoint_instance),
    Classifier(ENDPOINT_NAME, classify_endpoint_name),
)
"""ServiceControl's five classifiers, in its order."""

CLASSIFIERS: tuple[Classifier, ...] = (
    *SERVICECONTROL_CLASSIFIERS,
    Classifier(EXCEPTION_TYPE_AND_PYTHON_FRAME, classify_exception_type_and_python_frame),
    Classifier(PYTHON_TASK_QUEUE, classify_python_task_queue),
)
"""Every classifier, ServiceControl's first (the order of ``classify``'s result)."""


def bound_title(classification: str) -> str:
    """``classification`` as a storable title: at most ``MAX_TITLE_LENGTH`` code points,
    NUL and lone surrogates replaced (``headers.sanitize_text``)."""
    return h.sanitize_text(classification[:MAX_TITLE_LENGTH])


def classify(headers: Headers) -> tuple[FailureGroup, ...]:
    """The failure groups of one attempt: one per classifier that gives a non-empty title,
    in ``CLASSIFIERS`` order. ``id = identity.group_id(classifier, title)``."""
    groups = []
    for classifier in CLASSIFIERS:
        classification = classifier.classify(headers)
        if not classification:
            continue
        title = bound_title(classification)
        groups.append(FailureGroup(group_id(classifier.name, title), classifier.name, title))
    return tuple(groups)
