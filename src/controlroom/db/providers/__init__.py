"""The provider seam: everything that differs between databases, one module per database.

Each provider module (``sqlite``, ``postgresql``) exposes a ``PROVIDER``: an instance of a
``Provider`` subclass with the same small set of capabilities and statements (see
``_base.Provider``): the provider's ``insert`` construct, its limits, the upsert and
insert-if-absent constructs, the full-text search clause, the lease of background
singletons, engine setup and the classification of its driver's errors. This registry
picks one by the engine's dialect name; feature code asks the provider and never tests a
dialect's name itself. Source: docs/design.md "The provider seam". Adding a database is
one module here, its migration branches, the column and index variants of
``db/tables.py`` and a test parameter: the full checklist is ARCHITECTURE.md "The
provider seam".
"""

from __future__ import annotations

import sqlalchemy as sa

from controlroom.db.providers import postgresql, sqlite
from controlroom.db.providers._base import Provider, Row, chunked
from controlroom.exceptions import UnsupportedProviderError

PROVIDERS: dict[str, Provider] = {
    provider.name: provider for provider in (sqlite.PROVIDER, postgresql.PROVIDER)
}
"""Every supported provider by its SQLAlchemy backend name."""

EMBEDDED: sqlite.SQLiteProvider = sqlite.PROVIDER
"""The provider of the embedded default (a database file in the data dir)."""


def provider_named(name: str) -> Provider:
    """The provider whose SQLAlchemy backend name is ``name``.

    Raises ``UnsupportedProviderError`` naming the supported ones.
    """
    try:
        return PROVIDERS[name]
    except KeyError:
        raise UnsupportedProviderError(
            f"database provider {name!r} is not supported; use one of {', '.join(PROVIDERS)}"
        ) from None


def provider_for(bind: sa.Engine | sa.Connection | sa.Dialect) -> Provider:
    """The provider of ``bind`` (an engine, a connection or a dialect).

    Raises ``UnsupportedProviderError`` for a database without a provider module.
    """
    dialect = bind if isinstance(bind, sa.Dialect) else bind.dialect
    return provider_named(dialect.name)


__all__ = [
    "EMBEDDED",
    "PROVIDERS",
    "Provider",
    "Row",
    "chunked",
    "provider_for",
    "provider_named",
]
