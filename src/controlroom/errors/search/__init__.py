"""Full-text search over failed messages, one module per provider, chosen by a registry.

Each provider module exposes the same functions: ``matches(text)``, a WHERE clause over
``failed_messages`` that is true for the rows whose headers or body text contain the
user's ``text``, answered from the provider's full-text index (created in migration 0001),
never by a ``LIKE`` scan; and ``prepare(conn)``, run first in the transaction of the
search's statements (planner settings where the provider needs them). The user's text is
only ever a bound parameter, turned into a query the full-text engine reads literally: no
operator, prefix or column syntax of the user is interpreted. Source: DESIGN.md "Search",
STYLE.md "the provider seam".

Both providers find a dotted .NET type name or Python dotted path by the whole
(``System.InvalidOperationException``) and by any part (``InvalidOperationException``),
and several words only where all of them occur. SQLite asks for each word's parts
adjacent (an FTS5 phrase); PostgreSQL for the parts anywhere (see ``postgresql`` for why).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import sqlalchemy as sa

from controlroom.errors.search import postgresql, sqlite
from controlroom.exceptions import UnsupportedProviderError

SearchClause = Callable[[str], sa.ColumnElement[bool]]
"""``matches(text)``: the provider's full-text condition for the user's ``text``."""

_REGISTRY: dict[str, ModuleType] = {"postgresql": postgresql, "sqlite": sqlite}


def search_clause(dialect: sa.Dialect) -> SearchClause:
    """The ``matches`` function of ``dialect``'s provider.

    Raises ``UnsupportedProviderError`` for a provider without a full-text implementation.
    """
    try:
        module = _REGISTRY[dialect.name]
    except KeyError:
        raise UnsupportedProviderError(
            f"no full-text search for provider {dialect.name!r}"
        ) from None
    matches: SearchClause = module.matches
    return matches


def prepare_search(conn: sa.Connection) -> None:
    """Apply ``conn``'s provider settings for search statements to its current transaction.

    Raises ``UnsupportedProviderError`` like ``search_clause``.
    """
    search_clause(conn.dialect)  # the same refusal for an unknown provider
    _REGISTRY[conn.dialect.name].prepare(conn)


__all__ = ["SearchClause", "prepare_search", "search_clause"]
