"""PostgreSQL full-text search: the stored generated ``search_vector`` and its GIN index.

Migration 0001 indexes headers and body text twice in ``search_vector`` (text search
configuration ``simple``): as written, where PostgreSQL's parser keeps
``System.InvalidOperationException`` as one term, and with every run of non-alphanumeric
characters replaced by a space, so each part is a term too. The query mirrors that: the
user's text parsed as written (``plainto_tsquery``: every term must occur), OR the text
split the same way as a phrase (``phraseto_tsquery``: the parts adjacent and in order),
which finds a part of a dotted name (``Sales.PlaceOrderHandler`` inside
``Shop.Sales.PlaceOrderHandler.Handle``). Both functions read their input as plain words,
never as tsquery syntax, and it arrives as a bound parameter.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import REGCONFIG, TSVECTOR

# Must equal the configuration and the split pattern of migration 0001's search_vector.
TEXT_SEARCH_CONFIG = "simple"
SPLIT_PATTERN = "[^[:alnum:]]+"

# Not modelled in db.tables (it exists on PostgreSQL only); a constant column name.
_SEARCH_VECTOR = sa.literal_column("failed_messages.search_vector", type_=TSVECTOR)


def matches(text: str) -> sa.ColumnElement[bool]:
    """True for rows whose headers or body text contain ``text``.

    An empty ``text``, or one without letters or digits, matches nothing.
    """
    words = sa.literal(_without_nul(text), sa.Text)
    config = sa.cast(TEXT_SEARCH_CONFIG, REGCONFIG)
    split = sa.func.regexp_replace(words, SPLIT_PATTERN, " ", "g")
    query = sa.func.plainto_tsquery(config, words).op("||")(sa.func.phraseto_tsquery(config, split))
    return _SEARCH_VECTOR.bool_op("@@")(query)


def _without_nul(text: str) -> str:
    # PostgreSQL text cannot hold NUL; as a separator it changes no term.
    return text.replace("\x00", " ")
