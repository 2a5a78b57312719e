"""SQLite full-text search: the FTS5 external-content table ``failed_messages_fts``.

Migration 0001 indexes ``headers_json`` and ``body_text`` with the ``unicode61``
tokenizer, which splits at every character that is not a letter or digit:
``System.InvalidOperationException`` is the two adjacent terms ``system`` and
``invalidoperationexception``. The user's text becomes an FTS5 query of one quoted phrase
per whitespace-separated word (``fts_query``), all of which must occur: a dotted name is a
phrase of its parts, so it is found whole, and a part alone is found too. Inside a quoted
phrase FTS5 reads nothing as syntax (``AND``, ``NEAR``, ``*``, ``^``, ``col:``,
parentheses); the only special character, ``"``, is doubled.
"""

from __future__ import annotations

import sqlalchemy as sa

# The FTS table's rowid is failed_messages.rowid (content_rowid in migration 0001).
_FTS_TABLE = sa.table("failed_messages_fts", sa.column("rowid"))
_FTS_TABLE_NAME = sa.literal_column("failed_messages_fts")  # MATCH against the whole table
_ROWID = sa.literal_column("failed_messages.rowid")


def fts_query(text: str) -> str:
    """The FTS5 query for the user's ``text``: each word a quoted phrase, implicitly ANDed.

    Words are split at whitespace; a ``"`` inside a word is doubled, so ``System.Exception``
    becomes the phrase ``"System.Exception"`` and ``NEAR(`` the phrase ``"NEAR("``. Empty
    when ``text`` has no word. NUL counts as whitespace.
    """
    words = text.replace("\x00", " ").split()
    return " ".join('"' + word.replace('"', '""') + '"' for word in words)


def prepare(conn: sa.Connection) -> None:
    """Nothing to set: SQLite's planner takes the FTS5 index for ``MATCH`` by itself."""


def matches(text: str) -> sa.ColumnElement[bool]:
    """True for rows whose headers or body text contain ``text``.

    An empty ``text``, or one without letters or digits, matches nothing.
    """
    query = fts_query(text)
    if not query:
        return sa.false()  # FTS5 refuses an empty query string
    hits = sa.select(_FTS_TABLE.c.rowid).where(
        _FTS_TABLE_NAME.op("MATCH")(sa.literal(query, sa.Text))
    )
    return _ROWID.in_(hits)
