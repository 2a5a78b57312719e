"""``GET /api/configuration``: the effective settings, without secrets.

Shaped like ServiceControl's answer where the two overlap (``data_retention.
error_retention_period`` as a .NET time span string such as ``"15.00:00:00"``), with
Controlroom's own settings beside it. Never included: bearer tokens, the database and
broker URLs (they may carry passwords); the providers are named instead.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy.engine import make_url

from controlroom import __version__
from controlroom.config import Settings

router = APIRouter(tags=["configuration"])


def dotnet_timespan(span: timedelta) -> str:
    """``span`` as .NET's ``TimeSpan.ToString()`` writes it: ``[-][d.]hh:mm:ss[.fffffff]``
    (``"15.00:00:00"``, ``"01:30:00"``, ``"1.00:00:00.5000000"``)."""
    ticks = (span.days * 86_400 + span.seconds) * 10_000_000 + span.microseconds * 10
    sign = "-" if ticks < 0 else ""
    ticks = abs(ticks)
    seconds, fraction = divmod(ticks, 10_000_000)
    minutes, second = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    days, hour = divmod(hours, 24)
    text = f"{hour:02d}:{minute:02d}:{second:02d}"
    if days:
        text = f"{days}.{text}"
    if fraction:
        text = f"{text}.{fraction:07d}"
    return sign + text


def effective_configuration(settings: Settings) -> dict[str, Any]:
    """The settings as ``/api/configuration`` shows them (sizes in bytes, periods as
    .NET time spans, durations in seconds)."""
    ingestion = settings.ingestion
    return {
        "host": {
            "service_name": "Controlroom",
            "version": __version__,
            "host": settings.host,
            "port": settings.port,
            "data_directory": str(settings.data_dir),
            "database_provider": make_url(settings.effective_database_url).get_backend_name(),
            "authentication_enabled": bool(settings.auth_tokens),
        },
        "data_retention": {
            "error_retention_period": dotnet_timespan(settings.error_retention_period),
        },
        "performance_tunning": {  # sic: ServiceControl's key
            "max_body_size_to_store": settings.max_body_size_to_store,
        },
        "transport": {
            "transport_type": "RabbitMQ" if settings.broker_url else "Embedded",
            "error_queue": settings.error_queue,
        },
        "ingestion": {
            "ingest_on_serve": settings.ingest_on_serve,
            "batch_size": ingestion.batch_size,
            "concurrent_batches": ingestion.concurrent_batches,
            "linger_seconds": ingestion.linger_seconds,
            "prefetch": ingestion.effective_prefetch,
            "max_backoff_seconds": ingestion.max_backoff_seconds,
        },
    }


@router.get("/configuration")
def get_configuration(request: Request) -> dict[str, Any]:
    """The effective settings: retention, body cap, batch sizes, providers; no secrets."""
    return effective_configuration(request.app.state.settings)
