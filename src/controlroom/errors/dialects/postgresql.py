"""PostgreSQL: ``INSERT ... ON CONFLICT DO UPDATE`` (DESIGN.md "Stores")."""

from sqlalchemy.dialects.postgresql import insert

from controlroom.errors.dialects._base import ErrorWriteDialect

DIALECT = ErrorWriteDialect(name="postgresql", insert=insert)
