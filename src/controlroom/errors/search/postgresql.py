"""PostgreSQL full-text search: the stored generated ``search_vector`` and its GIN index.

Migration 0001 indexes headers and body text twice in ``search_vector`` (text search
configuration ``simple``): as written, where PostgreSQL's parser keeps
``System.InvalidOperationException`` as one term, and with every run of non-alphanumeric
characters replaced by a space, so that each part is a term too. The query splits the
user's text the same way and asks for every part (``plainto_tsquery``: the parts ANDed,
read as plain words, never as tsquery syntax, and passed as a bound parameter). A dotted
name is then found by the whole and by any part or run of parts
(``Sales.PlaceOrderHandler`` inside ``Shop.Sales.PlaceOrderHandler.Handle``).

Why not a phrase (parts adjacent, as SQLite's FTS5 query asks): a phrase, or any query
OR-ed with one, makes PostgreSQL recheck every candidate row against its stored
``search_vector``, detoasting it; for a term in a third of a million rows that took
seconds (``benchmarks/query.py``). The parts alone are answered from the GIN index
without a recheck, and the as-written terms add nothing a query could use that the
parts do not already match.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import REGCONFIG, TSVECTOR

# Must equal the configuration and the split pattern of migration 0001's search_vector.
TEXT_SEARCH_CONFIG = "simple"
SPLIT_PATTERN = "[^[:alnum:]]+"

# Memory for a search's bitmap of matching rows: at the default 4 MB, a term in 285,000
# of 1,000,000 rows made the bitmap lossy, and every row of a lossy page is rechecked
# against its detoasted search_vector (4 s instead of 1 s, benchmarks/query.py).
SEARCH_WORK_MEM = "64MB"

# Not modelled in db.tables (it exists on PostgreSQL only); a constant column name.
_SEARCH_VECTOR = sa.literal_column("failed_messages.search_vector", type_=TSVECTOR)


def matches(text: str) -> sa.ColumnElement[bool]:
    """True for rows whose headers or body text contain every part of ``text``.

    An empty ``text``, or one without letters or digits, matches nothing.
    """
    # Split in SQL, with the index's own pattern, so "alphanumeric" means the same to both.
    parts = sa.func.regexp_replace(sa.literal(_without_nul(text), sa.Text), SPLIT_PATTERN, " ", "g")
    query = sa.func.plainto_tsquery(sa.cast(TEXT_SEARCH_CONFIG, REGCONFIG), parts)
    return _SEARCH_VECTOR.bool_op("@@")(query)


def prepare(conn: sa.Connection) -> None:
    """Settings for the search statements of ``conn``'s current transaction.

    The planner does not know that ``@@`` detoasts each row's ``search_vector``: for a
    broad term it prefers scanning the whole table (5.7 s for a count over 1,000,000 rows)
    to the GIN index (1 s). Without sequential scans it takes the index, or walks a sort
    key's index when a page needs only a few rows. ``SET LOCAL`` ends with the transaction.
    """
    conn.exec_driver_sql(f"SET LOCAL work_mem = '{SEARCH_WORK_MEM}'")
    conn.exec_driver_sql("SET LOCAL enable_seqscan = off")


def _without_nul(text: str) -> str:
    # PostgreSQL text cannot hold NUL; as a separator it changes no term.
    return text.replace("\x00", " ")
