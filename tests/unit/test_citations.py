"""Comments cite the design kept in the repository, and cite it right.

Where a rule comes from is named as ``docs/design.md "Heading"`` or
``docs/decisions.md "Heading"`` (docs/README.md). A tracker number, the external brief or
its change log means nothing to a reader of the repository, and a heading that was renamed
or never existed sends the reader nowhere. A cited name is a heading of the file or one of
the wordings its "Also cited as" lines give for a section.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = {name: ROOT / "docs" / f"{name}.md" for name in ("design", "decisions")}

SCANNED_DIRS = ("src", "tests", "benchmarks")
"""Where neither a tracker number nor the brief may be cited."""
ROOT_MARKDOWN = (
    "README.md",
    "ARCHITECTURE.md",
    "docs/README.md",
    "docs/design.md",
    "docs/decisions.md",
)
"""Markdown outside those directories: no tracker numbers, and their citations checked."""
SUFFIXES = {".py", ".md", ".html", ".toml", ".sql"}
SKIPPED_DIRS = {"vendor", "__pycache__", "data"}
"""Third-party code and the recorded samples, which cite nothing of ours."""

PLACEHOLDER = "Heading"
"""The citation form as the documents describe it, not a citation."""

TRACKER = re.compile(
    r"\bissues?[\s-]+#?\d+"  # the word, then a number, with or without "#" or "-"
    r"|(?<![\w&/#])#\d{1,4}\b(?![\w;])",  # "#" and a number, but not "&#34;" or a colour
    re.IGNORECASE,
)
BRIEF = re.compile(
    r"(?<!docs/)\b(?i:design)\.md\b"  # the brief outside the repository
    r"|\b(?i:style)\.md\b"  # the team's style notes, outside it too
    r"|\bseed\s+(?:change\s+log\s+)?F\d",  # the brief's change log
    re.IGNORECASE,
)
CITATION = re.compile(
    # docs/decisions.md "Heading"; the name may be wrapped onto a comment's next line.
    r"(?<![\w.])(?:(?:\.\./)?docs/)?(design|decisions)\.md"
    r"(?:[ \t]+|[ \t]*\n\s*(?:#\s*)?)"
    r"\"([^\"]{1,300})\""
)
ANCHOR = re.compile(r"(?<![\w.])(?:(?:\.\./)?docs/)?(design|decisions)\.md#([\w-]+)")
ALSO_CITED = re.compile(r"^Also cited as (.*)$", re.MULTILINE)
QUOTED = re.compile(r"\"([^\"]+)\"|`([^`]+)`")


def _normalise(name: str) -> str:
    """``name`` on one line: a wrap, with a comment's ``#`` or a docstring's indent, is a
    space."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", name).strip()


def _slug(heading: str) -> str:
    """GitHub's anchor of ``heading``: lower case, punctuation dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


@cache
def cited_names(document: str) -> frozenset[str]:
    """The names ``docs/<document>.md`` may be cited by: its headings and aliases."""
    text = DOCS[document].read_text(encoding="utf-8")
    names = {m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+)$", text, re.MULTILINE)}
    for line in ALSO_CITED.finditer(text):
        names.update(a or b for a, b in QUOTED.findall(line.group(1)))
    return frozenset(names)


@cache
def anchors(document: str) -> frozenset[str]:
    text = DOCS[document].read_text(encoding="utf-8")
    return frozenset(_slug(m.group(1).strip()) for m in re.finditer(r"^#{1,6}\s+(.+)$", text, re.M))


def forbidden_citations(text: str, *, brief: bool = True) -> list[str]:
    """Each tracker number in ``text``, and each citation of the brief unless ``brief``
    is false, with its line number."""
    matches = [*TRACKER.finditer(text), *(BRIEF.finditer(text) if brief else ())]
    return [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}" for m in matches]


def missing_headings(text: str) -> list[str]:
    """Each citation of docs/design.md or docs/decisions.md in ``text`` naming a heading
    (or anchor) the document does not have, with its line number."""
    problems = []
    for m in CITATION.finditer(text):
        document, name = m.group(1), _normalise(m.group(2))
        if name != PLACEHOLDER and name not in cited_names(document):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f'line {line}: {document}.md "{name}"')
    for m in ANCHOR.finditer(text):
        if m.group(2) not in anchors(m.group(1)):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"line {line}: {m.group(1)}.md#{m.group(2)}")
    return problems


def _files(top: Path) -> list[Path]:
    return sorted(
        path
        for path in top.rglob("*")
        if path.is_file()
        and path.suffix in SUFFIXES
        and not SKIPPED_DIRS.intersection(path.relative_to(top).parts[:-1])
    )


SCANNED = [path for top in SCANNED_DIRS for path in _files(ROOT / top)]
MARKDOWN = [ROOT / name for name in ROOT_MARKDOWN]


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_scan_sees_the_code() -> None:
    assert ROOT / "src" / "controlroom" / "config.py" in SCANNED
    assert Path(__file__) in SCANNED


@pytest.mark.parametrize("path", SCANNED, ids=_id)
def test_no_tracker_numbers_or_brief(path: Path) -> None:
    assert forbidden_citations(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", MARKDOWN, ids=_id)
def test_no_tracker_numbers_in_the_markdown(path: Path) -> None:
    # docs/ links its siblings by bare name, so only tracker numbers are looked for here.
    assert forbidden_citations(path.read_text(encoding="utf-8"), brief=False) == []


@pytest.mark.parametrize("path", SCANNED + MARKDOWN, ids=_id)
def test_cited_headings_exist(path: Path) -> None:
    assert missing_headings(path.read_text(encoding="utf-8")) == []


# The checks themselves, on text built here so that this file cites nothing.
ISSUE, NUMBER = "Issue", "13"


@pytest.mark.parametrize(
    "text",
    [
        f"# {ISSUE} {NUMBER}: the read side",
        f'"""Source: {ISSUE.lower()}s {NUMBER} and 14."""',
        f"(see {ISSUE.lower()} #{NUMBER}, item 3)",
        f"fixed in #{NUMBER}.",
        "Source: " + "DESIGN" + '.md "Writer"',
        "(seed change log " + "F2)",
    ],
)
def test_forbidden_citations_are_found(text: str) -> None:
    assert forbidden_citations(text) != []


@pytest.mark.parametrize(
    "text",
    [
        "docs/design" + '.md "Writer"',
        "color: #333; &#34;sku&#34;",
        "the retry issue" + "d 3 messages",
        "# " + NUMBER + " rows",
    ],
)
def test_what_is_not_a_citation(text: str) -> None:
    assert forbidden_citations(text) == []


def test_missing_headings_are_found() -> None:
    good = "# docs/decisions" + '.md "Every delivery is\n    # settled exactly once"'
    assert missing_headings(good) == []
    design = "docs/design" + ".md "
    assert missing_headings(design + '"Background singletons"') == []
    assert missing_headings(design + '"The conditional upsert"') == []
    assert missing_headings(design + '"safe against concurrent writers"') == []
    assert missing_headings(design + '"Not a heading of it"') != []
    assert missing_headings("[x](decisions" + ".md#no-such-anchor)") != []
