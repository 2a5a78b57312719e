"""Per-provider SQL of retry batches: the claim (insert-if-absent).

The retry-batch seam, separate from the ingestion write dialect
(``controlroom.errors.dialects``): each provider module exposes a ``DIALECT`` with the
same methods (see ``_base.RetryBatchDialect``), chosen here by the engine's dialect name.
Source: STYLE.md "SQLAlchemy dialects — the provider seam". The processor's lease is
``controlroom.db.leases``.
"""

from __future__ import annotations

import sqlalchemy as sa

from controlroom.errors.retry_dialects import postgresql, sqlite
from controlroom.errors.retry_dialects._base import RetryBatchDialect
from controlroom.exceptions import UnsupportedProviderError

_REGISTRY: dict[str, RetryBatchDialect] = {
    "postgresql": postgresql.DIALECT,
    "sqlite": sqlite.DIALECT,
}


def retry_dialect(engine_or_dialect: sa.Engine | sa.Connection | sa.Dialect) -> RetryBatchDialect:
    """The retry-batch SQL for the provider of ``engine_or_dialect``.

    Raises ``UnsupportedProviderError`` for a provider without an implementation.
    """
    dialect = getattr(engine_or_dialect, "dialect", engine_or_dialect)
    try:
        return _REGISTRY[dialect.name]
    except KeyError:
        raise UnsupportedProviderError(
            f"no retry-batch SQL for provider {dialect.name!r}"
        ) from None


__all__ = ["RetryBatchDialect", "retry_dialect"]
