"""SQLite: ``INSERT ... ON CONFLICT DO NOTHING`` claims (inside ``BEGIN IMMEDIATE``)."""

from sqlalchemy.dialects.sqlite import insert

from controlroom.errors.retry_dialects._base import RetryBatchDialect

DIALECT = RetryBatchDialect(name="sqlite", insert=insert)
