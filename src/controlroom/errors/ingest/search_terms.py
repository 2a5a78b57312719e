"""The search terms of a failed message, and of a user's search (pure: no I/O).

Source: docs/design.md "Search": the terms are computed once, in the process, by one tokenizer
that also turns a user's query into terms, and written with the row; the server only
indexes them. One function for both sides, so the index and the query cannot disagree.

What is indexed: the *values* of the headers (not their names, which every message
shares) and ``body_text`` (the inline text, or the searchable prefix of an external
body), as *parts*: the runs of letters and digits of the lower-cased text (``[^\\W_]``:
white space, ``_`` and punctuation separate parts, as they did for the server-side index
this replaces). ``System.InvalidOperationException`` gives ``system`` and
``invalidoperationexception``.

A search asks for the parts of every word of the user's text, so
``System.InvalidOperationException``, ``InvalidOperationException``, a message id and
``{guid}\\16389`` are each found, whole or by any part, and nothing in the user's text is
ever read as syntax: terms are only ever bound values. The index holds no term a search
cannot ask for: a token as written (``system.invalidoperationexception``) would be an
entry per message that no query reads, most of them unique to their message (ids,
stamps), which is what makes the index's upkeep grow with the table
(docs/decisions.md "The index holds only the terms a search asks for").

Bounds (per message), so that one message never costs the index more than a fixed
amount and a huge body never stalls ingestion:

- ``MAX_TEXT_CHARS`` characters are read from the header values together and as many
  from the body text;
- a term keeps its first ``MAX_TERM_CHARS`` characters (a longer query word is cut the
  same way, so it still finds it);
- at most ``MAX_TERMS`` distinct terms: the header values' first, then the body text's.

Beyond a bound nothing stored is lost (the headers and the body stay whole); only the
searchability of what lies past it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from controlroom.db.providers import SearchQuery, SearchTerms

MAX_TEXT_CHARS = 100_000
"""Characters read from the header values (together), and as many from the body text."""

MAX_TERM_CHARS = 64
"""Characters a term keeps; longer tokens and parts are cut to their first 64."""

MIN_PREFIX_CHARS = 3
"""The shortest prefix a search looks terms up by: a shorter word ending in ``*`` is
looked for as a whole word, and a shorter plain word is never widened (``widened``), so
that one letter never reads the index's every term starting with it."""

MAX_TERMS = 3_000
"""Distinct terms per message. With ``MAX_TERM_CHARS`` (at most 4 UTF-8 bytes a
character) a message's terms stay under PostgreSQL's 1 MB limit of a ``tsvector``."""

# A part: a run of letters and digits (Unicode), underscore excluded.
_PART = re.compile(r"[^\W_]+")
# Lower-cased text whose every character outside ASCII is a letter or a digit (the usual
# header values, and bodies whose only non-ASCII characters are accented words) is cut
# without a regular expression, by a translation table over its UTF-8 bytes
# (bytes.translate, then str.split: a pass each, in C) that keeps the letters and digits
# [a-z0-9] and every byte of a character outside ASCII (here always a letter or digit:
# its bytes are all 0x80 and above) and blanks the rest. The same parts as the pattern
# gives (tests/unit/test_search_terms.py keeps the regular-expression tokenizer as the
# reference), at a fraction of its CPU; the tokenizer is the largest part of the write
# path's client CPU (benchmarks/README.md).
_ASCII_ALNUM = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789")
_ASCII_PARTS = bytes(c if c in _ASCII_ALNUM or c >= 0x80 else 0x20 for c in range(256))
# A character outside ASCII that is neither a letter nor a digit (a separator such as a
# non-breaking space or a lone surrogate, or a joiner such as a dash): text holding one
# takes the pattern. ``\w`` is the letters and digits (``str.isalnum``) and ``_``.
_NOT_ALNUM_OUTSIDE_ASCII = re.compile(r"[^\x00-\x7f\w]")


def _cut(terms: list[str]) -> list[str]:
    if terms and max(map(len, terms)) > MAX_TERM_CHARS:
        return [term[:MAX_TERM_CHARS] for term in terms]
    return terms


def _add_terms(text: str, terms: dict[str, None]) -> None:
    """Add the parts of ``text`` to ``terms``, in order of occurrence: one pass over the
    whole text, none per character in Python."""
    lowered = text.lower()
    if lowered.isascii() or not _NOT_ALNUM_OUTSIDE_ASCII.search(lowered):
        # Translating ASCII bytes to ASCII bytes keeps every multi-byte character whole.
        parts = lowered.encode("utf-8").translate(_ASCII_PARTS).decode("utf-8").split()
    else:
        parts = _PART.findall(lowered)
    terms.update(dict.fromkeys(_cut(parts)))


def message_search_terms(headers: Mapping[str, str | None], body_text: str | None) -> list[str]:
    """The search terms of a failed message with ``headers`` and ``body_text`` (``None``
    for a body without text): distinct, lower-cased, non-empty, at most ``MAX_TERMS`` of
    at most ``MAX_TERM_CHARS`` characters each; the header values' parts, then the body
    text's, each in order of occurrence."""
    terms: dict[str, None] = {}
    values = "\n".join(value for value in headers.values() if value)
    _add_terms(values[:MAX_TEXT_CHARS], terms)
    if body_text and len(terms) < MAX_TERMS:
        _add_terms(body_text[:MAX_TEXT_CHARS], terms)
    return list(terms)[:MAX_TERMS]


def query_search_terms(text: str) -> list[str]:
    """The terms a search for the user's ``text`` requires, every one of them: the parts
    of its words, lower-cased and cut as the index cuts them, distinct, in order. Empty
    when ``text`` has no letter or digit (such a search matches nothing by its terms)."""
    return list(dict.fromkeys(part[:MAX_TERM_CHARS] for part in _PART.findall(text.lower())))


def parse_search(text: str, *, any_word: bool = False) -> SearchQuery:
    """The ``SearchQuery`` of the user's ``text``: the terms of ``query_search_terms``,
    except that a word (cut at white space) ending in ``*`` asks for its last part as a
    prefix, when that part has at least ``MIN_PREFIX_CHARS`` characters (``InvalidOp*``:
    any term starting with ``invalidop``). Every term is required; with ``any_word``
    those of any one word (ServiceControl's keyword search ORs the words; a dotted name
    is still found whole or by its parts)."""
    if any_word:  # a word given twice is one alternative (a planner counts each one)
        return SearchQuery(tuple(dict.fromkeys(_word_terms(word) for word in text.split())))
    return SearchQuery((_word_terms(text),))


def _word_terms(text: str) -> SearchTerms:
    """The terms of ``text`` for ``parse_search``, all required."""
    prefixes: dict[str, None] = {}
    for word in text.split():
        parts = _PART.findall(word.lower())
        if word.endswith("*") and parts and len(parts[-1]) >= MIN_PREFIX_CHARS:
            prefixes[parts[-1][:MAX_TERM_CHARS]] = None
    words = [term for term in query_search_terms(text) if term not in prefixes]
    return SearchTerms(words=tuple(words), prefixes=tuple(prefixes))


def widened(query: SearchQuery) -> SearchQuery:
    """``query`` with each of its words of at least ``MIN_PREFIX_CHARS`` characters asked
    for as a prefix instead: the search the console runs when ``query`` matched nothing
    (docs/design.md "Search")."""
    return SearchQuery(
        tuple(
            SearchTerms(
                words=tuple(word for word in terms.words if len(word) < MIN_PREFIX_CHARS),
                prefixes=terms.prefixes
                + tuple(word for word in terms.words if len(word) >= MIN_PREFIX_CHARS),
            )
            for terms in query.alternatives
        )
    )


def widened_words(query: SearchQuery, wider: SearchQuery) -> list[str]:
    """The words of ``query`` that ``wider`` (``widened(query)``) asks for as prefixes."""
    return list(
        dict.fromkeys(
            prefix
            for before, after in zip(query.alternatives, wider.alternatives, strict=True)
            for prefix in after.prefixes
            if prefix not in before.prefixes
        )
    )
