"""The HTTP API (FastAPI), following ServiceControl's conventions: snake_case JSON,
``Total-Count`` and ``Link`` paging headers, ISO 8601 UTC times ending in ``Z``.

The routers live here; ``controlroom.app.create_app`` assembles them with the console."""

from controlroom.api.health import HealthCheck, database_check

__all__ = ["HealthCheck", "database_check"]
