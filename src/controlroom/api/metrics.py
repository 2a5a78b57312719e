"""``GET /metrics``: the process's Prometheus metrics (docs/decisions.md "Metrics are
labelled by route template").

The counters live beside the code that counts (``controlroom_ingested_messages_total``,
``controlroom_ingestion_batch_seconds`` and the error queue's
``controlroom_queue_depth_messages`` and ``controlroom_queue_lag_seconds`` gauges, by
queue name, in the ingestion pipeline,
``controlroom_retried_messages_total`` in the retry processor,
``controlroom_retention_deleted_total`` in retention); this module serves them, and
counts HTTP requests by method, route template (``/api/errors/{id}``, never the path
itself, so the label stays low-cardinality) and status. The route needs role ``reader``
when tokens are configured (Prometheus sends a bearer token).

Beside them, each scrape reads the site-call gauges from the database (a fresh registry
per scrape, so a site that is gone leaves no stale series): per configured site
``controlroom_site_reachable`` and ``controlroom_site_pinned`` (1 or 0; reachable absent
before any pass) and ``controlroom_site_reconciliation_lag_seconds`` (since its last
successful pass; absent before one), and per source site every KPI of
``sitecalls/kpis.py`` as ``controlroom_sitecalls_<kpi>`` (sum the counts, take the max of
the age, for the global figure); and per channel every KPI of the notification outbox
(``notifications/queries.py``) as ``controlroom_notifications_<kpi>``. A database that
cannot be read leaves them out.
The intakes' gauges (``runtime.intake_health``: ``controlroom_intake_degraded``,
``..._write_failures``, ``..._last_stored_timestamp_seconds``, by intake) are brought up to
date at each scrape.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from starlette.routing import Route, WebSocketRoute, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlroom.config import Settings
from controlroom.db.kpi_history import METRICS, KpiFigures
from controlroom.notifications.queries import measure_kpis as notification_kpis
from controlroom.sitecalls.kpis import measure_kpis
from controlroom.sitecalls.reconciliation import reconciliation_lag, site_states

log = logging.getLogger(__name__)

router = APIRouter(tags=["metrics"])

HTTP_REQUESTS = Counter(
    "controlroom_http_requests_total",
    "HTTP requests answered, by method, route template and status",
    ["method", "route", "status"],
)

RouteTemplates = list[tuple[re.Pattern[str], str]]
"""Compiled route patterns with the template each stands for."""

UNMATCHED = "unmatched"
"""The route label of a request no route took (404s of arbitrary paths stay one label)."""


@router.get("/metrics", include_in_schema=False)
def get_metrics(request: Request) -> Response:
    """Every metric of this process (with those of its intake workers when
    ``app.state.exposition`` merges them in), then the site-call gauges, in the
    Prometheus text format."""
    state = request.app.state
    for intake in state.intakes:
        intake.state()  # its gauges as of now: a stall is a matter of time passing
    try:
        site_calls = generate_latest(site_call_gauges(state.engine, state.settings))
    except Exception:  # the health endpoint says why; the process's metrics still serve
        log.warning("could not read the site-call gauges", exc_info=True)
        site_calls = b""
    try:
        outbox = generate_latest(notification_gauges(state.engine, state.settings))
    except Exception:
        log.warning("could not read the notification gauges", exc_info=True)
        outbox = b""
    own = state.exposition() if state.exposition is not None else generate_latest()
    return Response(own + site_calls + outbox, media_type=CONTENT_TYPE_LATEST)


def notification_gauges(engine: sa.Engine, settings: Settings) -> CollectorRegistry:
    """A registry holding the outbox's KPIs per channel (``controlroom_notifications_<kpi>``,
    ``notifications/queries.py``) as the database has them now."""
    registry = CollectorRegistry()
    with engine.connect() as conn:
        scopes = notification_kpis(
            conn,
            now=datetime.now(UTC),
            interval=settings.kpi.interval,
            stuck_threshold=settings.kpi.stuck_threshold,
        )
    gauges: dict[str, Gauge] = {}
    for channel, kpis in sorted(scopes.items()):
        if not channel:
            continue  # the global figures are the sum (the max for the age) of these
        for metric, value in kpis.items():
            if metric not in gauges:
                gauges[metric] = Gauge(
                    f"controlroom_notifications_{metric}",
                    f"Notification outbox KPI {metric} per channel (notifications/queries.py)",
                    ["channel"],
                    registry=registry,
                )
            if value is not None:
                gauges[metric].labels(channel).set(value)
    return registry


def site_call_gauges(engine: sa.Engine, settings: Settings) -> CollectorRegistry:
    """A registry holding the site-call gauges as the database has them now."""
    registry = CollectorRegistry()
    now = datetime.now(UTC)
    with engine.connect() as conn:
        states = site_states(conn, settings.sites)
        report = measure_kpis(
            conn,
            now=now,
            interval=settings.kpi.interval,
            stuck_threshold=settings.kpi.stuck_threshold,
        )
    reachable = Gauge(
        "controlroom_site_reachable",
        "Whether the site's last reconciliation pass reached it (1) or not (0)",
        ["site"],
        registry=registry,
    )
    pinned = Gauge(
        "controlroom_site_pinned",
        "Whether the site is pinned: reconciliation cannot advance past one stamp",
        ["site"],
        registry=registry,
    )
    lag = Gauge(
        "controlroom_site_reconciliation_lag_seconds",
        "Seconds since the site's last successful reconciliation pass",
        ["site"],
        registry=registry,
    )
    for site in states:
        pinned.labels(site.id).set(int(site.pinned))
        if site.reachable is not None:
            reachable.labels(site.id).set(int(site.reachable))
        seconds = reconciliation_lag(site, now)
        if seconds is not None:
            lag.labels(site.id).set(seconds)
    kpis: dict[str, Gauge] = {
        metric: Gauge(
            f"controlroom_sitecalls_{metric}",
            f"Site-call KPI {metric} per source site (sitecalls/kpis.py)",
            ["site"],
            registry=registry,
        )
        for metric in METRICS
    }
    figures = report.sites()
    for configured in settings.sites:
        figures.setdefault(configured.id, KpiFigures())
    for site_id, site_figures in sorted(figures.items()):
        for metric, value in site_figures.as_dict(now).items():
            if value is not None:
                kpis[metric].labels(site_id).set(value)
    return registry


class RequestMetrics:
    """Counts each HTTP request once its answer starts (``HTTP_REQUESTS``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        path = scope["path"]

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                template = _template(scope, path)
                HTTP_REQUESTS.labels(scope["method"], template, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


def route_templates(routers: Iterable[tuple[APIRouter, str]]) -> RouteTemplates:
    """The full template of every route of ``routers`` (each with the prefix it is
    included under), literal paths first so that ``/api/errors/summary`` wins over
    ``/api/errors/{id}``. Built once per app, from the routers themselves: FastAPI keeps
    included routes behind a private wrapper, and its OpenAPI schema costs a quarter of a
    second to build."""
    templates = sorted(
        (
            prefix + route.path
            for router, prefix in routers
            for route in router.routes
            if isinstance(route, Route | WebSocketRoute)
        ),
        key=lambda template: (template.count("{"), template),
    )
    return [(compile_path(template)[0], template) for template in dict.fromkeys(templates)]


def _template(scope: Scope, path: str) -> str:
    """The full template of the route that answered (``/api/errors/{id}``). Routing
    leaves the matched route in the scope with its path relative to its router, so the
    full template is looked up in the app's ``state.route_templates``; a route not listed
    there (the console's) keeps its own path; no route at all is ``UNMATCHED``."""
    route = scope.get("route")
    if route is None:
        return UNMATCHED
    app: Any = scope.get("app")
    state = getattr(app, "state", None)
    templates: RouteTemplates = getattr(state, "route_templates", [])
    for pattern, template in templates:
        if pattern.fullmatch(path):
            return template
    return str(getattr(route, "path", UNMATCHED))
