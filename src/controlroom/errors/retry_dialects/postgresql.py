"""PostgreSQL: ``INSERT ... ON CONFLICT DO NOTHING`` claims."""

from sqlalchemy.dialects.postgresql import insert

from controlroom.errors.retry_dialects._base import RetryBatchDialect

DIALECT = RetryBatchDialect(name="postgresql", insert=insert)
