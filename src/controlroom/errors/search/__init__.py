"""Full-text search over failed messages, one module per provider, chosen by a registry.

Each provider module exposes the same function, ``matches(text)``: a WHERE clause over
``failed_messages`` that is true for the rows whose headers or body text contain the
user's ``text``, answered from the provider's full-text index (created in migration 0001),
never by a ``LIKE`` scan. The user's text is only ever a bound parameter, turned into a
query the full-text engine reads literally: no operator, prefix or column syntax of the
user is interpreted. Source: DESIGN.md "Search", STYLE.md "the provider seam".

Both providers find a dotted .NET type name or Python dotted path by the whole
(``System.InvalidOperationException``) and by any part (``InvalidOperationException``),
and several words only where all of them occur.
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


__all__ = ["SearchClause", "search_clause"]
