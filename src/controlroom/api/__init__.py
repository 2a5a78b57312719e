"""The HTTP API (FastAPI), following ServiceControl's conventions: snake_case JSON,
``Total-Count`` and ``Link`` paging headers, ISO 8601 UTC times ending in ``Z``."""

from controlroom.api.app import create_app
from controlroom.api.health import HealthCheck, database_check

__all__ = ["HealthCheck", "create_app", "database_check"]
