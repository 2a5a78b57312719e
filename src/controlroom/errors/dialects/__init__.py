"""Per-provider SQL for the error instance's write path, chosen by a registry.

Each provider module exposes the same functions (see ``_base.ErrorWriteDialect``); the
differences between providers live there and nowhere else. Source: STYLE.md
"SQLAlchemy dialects — the provider seam".
"""

from __future__ import annotations

import sqlalchemy as sa

from controlroom.errors.dialects import postgresql, sqlite
from controlroom.errors.dialects._base import ErrorWriteDialect
from controlroom.exceptions import UnsupportedProviderError

_REGISTRY: dict[str, ErrorWriteDialect] = {
    "postgresql": postgresql.DIALECT,
    "sqlite": sqlite.DIALECT,
}


def error_write_dialect(engine_or_dialect: sa.Engine | sa.Dialect) -> ErrorWriteDialect:
    """The write-path SQL for ``engine_or_dialect``'s provider.

    Raises ``UnsupportedProviderError`` for a provider without an implementation.
    """
    dialect = getattr(engine_or_dialect, "dialect", engine_or_dialect)
    try:
        return _REGISTRY[dialect.name]
    except KeyError:
        raise UnsupportedProviderError(
            f"no error-instance write SQL for provider {dialect.name!r}"
        ) from None


__all__ = ["ErrorWriteDialect", "error_write_dialect"]
