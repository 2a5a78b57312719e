"""Python tracebacks read as frames (pure, no I/O): for the ``Exception Type and Python
Frame`` classifier, the console and the API.

A Python traceback (``traceback.format_exception``) is one or more sections, each
``Traceback (most recent call last):``, its frames outermost first (``File "path", line N,
in function`` and, indented below, the source line and 3.11's ``^^^`` markers), then the
exception line; chained exceptions print the cause's section first, then "The above
exception was the direct cause of the following exception:" (or "During handling of the
above exception, another exception occurred:"), then the next section. The LAST section
is the exception that escaped, the one that failed the task.

A frame is the application's own unless its file is the standard library's or an
installed package's (docs/decisions.md "Python frames are grouped by module tail and
function"): a path with a ``site-packages`` or ``dist-packages`` directory, the standard
library (``lib/pythonX.Y/``, Windows' ``PythonXY/Lib/``, ``pythonXY.zip``), or a
pseudo-file in angle brackets (``<frozen importlib._bootstrap>``, ``<string>``).

Everything here is linear in the size of the text: lines are cut with ``str.find``, a
regular expression only ever runs on one stripped line that starts with ``File "``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TRACEBACK_HEADER = "Traceback (most recent call last):"

MAX_FRAMES = 1000
"""Frames parsed for display; past them the rest of the text is kept as text."""

MAX_LINE_DIGITS = 18
"""Digits of a frame's line number read as a number (it then fits 64 bits); a longer one
is no file's line, and ``int`` refuses one past 4,300 digits: such a frame has no line."""

# One frame line, stripped. [^"]* cannot cross the closing quote: linear in the line.
_FRAME_RE = re.compile(r'File "([^"]*)", line ([0-9]+), in (.+)')
_LIBRARY_DIRS = ("/site-packages/", "/dist-packages/")
# The standard library's directory: lib/python3.12/ (POSIX, venvs, pyenv, conda, uv;
# 3.13's free-threaded lib/python3.13t/), Python312/Lib/ (Windows), python312.zip/.
_STDLIB_RE = re.compile(
    r"/lib(?:64)?/(?:python|pypy)[0-9]+(?:\.[0-9]+)?t?/"
    r"|/(?:python|pypy)[0-9]+[^/]*/lib/"
    r"|/(?:python|pypy)[0-9]+\.zip/",
    re.IGNORECASE,
)
_MARKER_ONLY = frozenset("^~ ")
_LEADING_SPACE = re.compile(r"\s*")
_CUT_RE = re.compile(r"\.\.\. [0-9]+ characters cut \.\.\.")


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: ``path`` as written, ``line`` (``None`` if absent or longer than
    ``MAX_LINE_DIGITS``), ``function``, ``source`` (the source line(s) printed below it,
    stripped; ``""`` if none) and whether it is the ``application``'s own code (see the
    module doc)."""

    path: str
    line: int | None
    function: str
    source: str
    application: bool

    @property
    def short_path(self) -> str:
        """``stable_path(path)``: the file without the machine's directories."""
        return stable_path(self.path)


@dataclass(frozen=True, slots=True)
class Section:
    """One ``Traceback (most recent call last):`` section: its ``frames``, outermost
    first, and the ``text`` that follows them (the exception line, and the sentence
    that links it to the next section), as written."""

    frames: tuple[Frame, ...]
    text: str


@dataclass(frozen=True, slots=True)
class FrameRun:
    """Consecutive frames that are all the ``application``'s own, or all library frames
    (the console folds a run of library frames)."""

    application: bool
    frames: tuple[Frame, ...]


def frame_runs(frames: tuple[Frame, ...]) -> tuple[FrameRun, ...]:
    """``frames`` cut into runs of application frames and of library frames, in order."""
    runs: list[FrameRun] = []
    start = 0
    for index in range(1, len(frames) + 1):
        if index == len(frames) or frames[index].application != frames[start].application:
            runs.append(FrameRun(frames[start].application, frames[start:index]))
            start = index
    return tuple(runs)


@dataclass(frozen=True, slots=True)
class PythonTraceback:
    """A parsed traceback: ``preamble`` (text before the first section, usually empty)
    and its ``sections`` in printed order (the escaping exception's last)."""

    preamble: str
    sections: tuple[Section, ...]


def is_python_traceback(text: str | None) -> bool:
    """Whether ``text`` is a Python traceback: its first non-blank line is
    ``Traceback (most recent call last):``."""
    if not text:
        return False
    leading = _LEADING_SPACE.match(text)  # white space only: never a copy of the text
    start = leading.end() if leading else 0
    return text.startswith(TRACEBACK_HEADER, start)


def is_application_path(path: str) -> bool:
    """Whether a frame's file is the application's own code: not an installed package,
    not the standard library, not a pseudo-file (``<frozen ...>``, ``<string>``)."""
    if path.startswith("<") and path.endswith(">"):
        return False
    normal = "/" + path.replace("\\", "/")
    if any(marker in normal for marker in _LIBRARY_DIRS):
        return False
    return _STDLIB_RE.search(normal) is None


def stable_path(path: str) -> str:
    """The part of a frame's file that is the same on every machine (no absolute path).

    An installed package's or the standard library's file: the path below
    ``site-packages/`` (``celery/app/trace.py``) or the standard library's directory
    (``json/decoder.py``). A pseudo-file as written. The application's file: its last two
    components, the module and its package (``/srv/app-1.4/orders/tasks.py`` →
    ``orders/tasks.py``), since where the application is deployed differs by machine
    and its package layout does not. Backslashes read as slashes.
    """
    if path.startswith("<") and path.endswith(">"):
        return path
    normal = "/" + path.replace("\\", "/")
    cut = max(normal.rfind(marker) + len(marker) for marker in _LIBRARY_DIRS)
    if cut >= len(_LIBRARY_DIRS[0]):
        return normal[cut:]
    stdlib_end = max((found.end() for found in _STDLIB_RE.finditer(normal)), default=None)
    if stdlib_end is not None:
        return normal[stdlib_end:]
    parts = [part for part in normal.split("/") if part]
    return "/".join(parts[-2:])


def _frame_match(line: str) -> re.Match[str] | None:
    text = line.strip()
    if not text.startswith('File "'):
        return None
    return _FRAME_RE.fullmatch(text)


def escaping_frame(trace: str, message: str | None = None) -> tuple[str, str] | None:
    """``(stable path, function)`` of the frame that identifies where the escaping
    exception was raised, or ``None`` when the trace has no frame.

    Only the last section counts (the exception that escaped; its causes are earlier
    sections), and only its frame lines up to the first line that is not a frame's (the
    exception line); where a bounded traceback was cut (``is_cut_marker``), the marker
    and the partial lines around it are read past. In it, the innermost application
    frame; with none (the failure was raised wholly inside libraries), the innermost
    frame. The escaping exception's
    ``message`` is printed after its frames: the text from its last occurrence on is not
    searched for a section, so a message that poses as a traceback is not taken for one
    (the message is not removed from the text as a whole: a message such as ``1`` would
    change every path that holds it). Frame lines of an exception group's sub-exceptions
    (prefixed ``|``) are not the group's own and are not read.
    """
    found = trace.rfind(message) if message else -1
    limit = found if found != -1 else len(trace)
    start = _last_section_start(trace, limit)
    if start is None:
        return None
    innermost: tuple[str, str] | None = None
    application: tuple[str, str] | None = None
    after_cut = False
    pos = start
    while pos < limit:
        end = trace.find("\n", pos)
        if end == -1:
            end = len(trace)
        line = trace[pos:end]
        pos = end + 1
        match = _frame_match(line)
        if match is not None:
            path, _, function = match.groups()
            innermost = (stable_path(path), function)
            if is_application_path(path):
                application = innermost
            after_cut = False
        elif is_cut_marker(line):
            after_cut = True  # the next line starts mid-line: not a frame's, read past it
        elif after_cut:
            after_cut = False
        elif _followed_by_cut(trace, pos):
            continue  # it ends mid-line
        elif innermost is None or not _belongs_to_frame(line):
            break
    return application or innermost


def _followed_by_cut(text: str, pos: int) -> bool:
    """Whether the line starting at ``pos`` is a cut marker (the line before it ends
    mid-line)."""
    end = text.find("\n", pos)
    return pos < len(text) and is_cut_marker(text[pos : end if end != -1 else len(text)])


def is_cut_marker(line: str) -> bool:
    """Whether ``line`` is the line a bounded traceback carries where its middle was cut
    (``... N characters cut ...``, as ``controlroom.integrations`` bounds a traceback,
    keeping its first and last halves)."""
    return _CUT_RE.fullmatch(line.strip()) is not None


def _last_section_start(trace: str, end: int) -> int | None:
    """Offset of the line after the last line before ``end`` that is exactly the section
    header (white space around it allowed). Each candidate is checked by walking only
    over the white space around it, so many headers on one long line stay linear."""
    while True:
        found = trace.rfind(TRACEBACK_HEADER, 0, end)
        if found == -1:
            return None
        before = found
        while before > 0 and trace[before - 1] in " \t\r":
            before -= 1
        after = found + len(TRACEBACK_HEADER)
        while after < len(trace) and trace[after] in " \t\r":
            after += 1
        if (before == 0 or trace[before - 1] == "\n") and (
            after == len(trace) or trace[after] == "\n"
        ):
            return after + 1
        end = found


def parse_traceback(text: str, message: str | None = None) -> PythonTraceback | None:
    """``text`` as sections of frames, or ``None`` when it is not a Python traceback
    (``is_python_traceback``). Every line of ``text`` is kept, in a frame, in a section's
    text or in the preamble, except the header lines and the ``^^^`` marker lines. A line
    such as ``[Previous line repeated 996 more times]`` joins its frame's source, and so do
    a bounded traceback's cut (``is_cut_marker``) and the partial lines around it. At most
    ``MAX_FRAMES`` frames are parsed; what follows stays text. The escaping exception's
    ``message``, as ``escaping_frame`` reads it: the lines after its last occurrence's
    first are its section's text, never a section or a frame of their own."""
    if not is_python_traceback(text):
        return None
    found = text.rfind(message) if message else -1
    literal_from = found if found != -1 else len(text) + 1
    preamble: list[str] = []
    sections: list[Section] = []
    frames: list[tuple[re.Match[str], list[str]]] = []
    tail: list[str] = []
    in_section = False
    after_cut = False
    parsed = 0

    def close() -> None:
        built = tuple(
            Frame(
                path, _line_number(number), function, "\n".join(source), is_application_path(path)
            )
            for (path, number, function), source in ((m.groups(), s) for m, s in frames)
        )
        sections.append(Section(built, "\n".join(tail).strip("\n")))
        frames.clear()
        tail.clear()

    pos = 0
    while pos <= len(text):
        end = text.find("\n", pos)
        if end == -1:
            end = len(text)
        line = text[pos:end].rstrip("\r")
        start, pos = pos, end + 1
        if start > literal_from and in_section:  # the message's own lines: text
            tail.append(line)
            continue
        if line.strip() == TRACEBACK_HEADER:
            if in_section:
                close()
            in_section = True
            continue
        if not in_section:
            preamble.append(line)
            continue
        in_frames = frames and not tail
        match = _frame_match(line) if parsed < MAX_FRAMES and (in_frames or not frames) else None
        if match is not None and not tail:
            frames.append((match, []))
            parsed += 1
            after_cut = False
            continue
        if in_frames and (after_cut or is_cut_marker(line) or _followed_by_cut(text, pos)):
            # A bounded traceback's cut and the partial lines around it: the frame's.
            after_cut = is_cut_marker(line)
            frames[-1][1].append(line.strip())
            continue
        if in_frames and _belongs_to_frame(line):
            if not _MARKER_ONLY.issuperset(line):
                frames[-1][1].append(line.strip())
            continue
        tail.append(line)
    if in_section:
        close()
    return PythonTraceback("\n".join(preamble).strip("\n"), tuple(sections))


def _line_number(digits: str) -> int | None:
    """A frame's line number, or ``None`` past ``MAX_LINE_DIGITS`` digits."""
    return int(digits) if len(digits) <= MAX_LINE_DIGITS else None


def _belongs_to_frame(line: str) -> bool:
    """A line printed under a frame: indented by 4 or more (frames are indented by 2), or
    a ``[Previous line repeated N more times]`` note."""
    text = line.strip()
    if not text:
        return False
    return line.startswith("    ") or (text.startswith("[") and text.endswith("]"))
