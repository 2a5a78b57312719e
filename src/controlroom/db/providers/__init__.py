"""The provider seam: everything that differs between databases, one module per database.

Each provider module (``sqlite``, ``postgresql``) exposes a ``PROVIDER``: an instance of a
``Provider`` subclass with the same small set of capabilities and statements (see
``_base.Provider``): the provider's ``insert`` construct, its limits, the upsert and
insert-if-absent constructs, the full-text search clause, the lease of background
singletons, engine setup and the classification of its driver's errors. This registry
picks one by the engine's dialect name; feature code asks the provider and never tests a
dialect's name itself. A provider module is imported the first time its provider is asked
for, so a process pays only for the databases it uses: the site agent, on SQLite alone,
never loads psycopg. Source: docs/design.md "The provider seam". Adding a database is
one module here, its migration branches, the column and index variants of
``db/tables.py`` and a test parameter: the full checklist is ARCHITECTURE.md "The
provider seam".
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType

import sqlalchemy as sa

from controlroom.db.providers import sqlite
from controlroom.db.providers._base import Provider, Row, SearchQuery, SearchTerms, chunked
from controlroom.exceptions import UnsupportedProviderError

PROVIDER_MODULES: Mapping[str, str] = MappingProxyType(
    {
        "sqlite": "controlroom.db.providers.sqlite",
        "postgresql": "controlroom.db.providers.postgresql",
    }
)
"""Every supported provider's SQLAlchemy backend name, with the module whose ``PROVIDER``
it is (imported on first use by ``provider_named``)."""

BACKEND_ALIASES: Mapping[str, str] = MappingProxyType({"postgres": "postgresql"})
"""Backend names users write for a supported one (``postgres://``, as Heroku and many
libraries spell PostgreSQL URLs), which SQLAlchemy itself no longer takes."""

EMBEDDED: sqlite.SQLiteProvider = sqlite.PROVIDER
"""The provider of the embedded default (a database file in the data dir)."""

_loaded: dict[str, Provider] = {EMBEDDED.name: EMBEDDED}
"""The providers whose module has been imported, by backend name. Filled without a lock:
``import_module`` holds the import lock, so two threads asking at once store the one
instance the module made."""


def provider_named(name: str) -> Provider:
    """The provider whose SQLAlchemy backend name is ``name``, its module imported on the
    first call for that name.

    Raises ``UnsupportedProviderError`` naming the supported ones.
    """
    name = BACKEND_ALIASES.get(name, name)
    provider = _loaded.get(name)
    if provider is None:
        try:
            module = PROVIDER_MODULES[name]
        except KeyError:
            raise UnsupportedProviderError(
                f"database provider {name!r} is not supported; "
                f"use one of {', '.join(PROVIDER_MODULES)}"
            ) from None
        provider = _loaded[name] = importlib.import_module(module).PROVIDER
    return provider


def loaded_providers() -> tuple[Provider, ...]:
    """The providers asked for so far in this process (the embedded one always), in the
    order they were first loaded."""
    return tuple(_loaded.values())


def provider_for(bind: sa.Engine | sa.Connection | sa.Dialect) -> Provider:
    """The provider of ``bind`` (an engine, a connection or a dialect).

    Raises ``UnsupportedProviderError`` for a database without a provider module.
    """
    dialect = bind if isinstance(bind, sa.Dialect) else bind.dialect
    return provider_named(dialect.name)


__all__ = [
    "EMBEDDED",
    "PROVIDER_MODULES",
    "Provider",
    "Row",
    "SearchQuery",
    "SearchTerms",
    "chunked",
    "loaded_providers",
    "provider_for",
    "provider_named",
]
