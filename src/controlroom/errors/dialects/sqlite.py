"""SQLite: ``INSERT ... ON CONFLICT DO UPDATE`` inside ``BEGIN IMMEDIATE`` (DESIGN.md "Stores")."""

from sqlalchemy.dialects.sqlite import insert

from controlroom.errors.dialects._base import ErrorWriteDialect

DIALECT = ErrorWriteDialect(name="sqlite", insert=insert)
