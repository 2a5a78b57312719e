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
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from starlette.routing import Route, WebSocketRoute, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
def get_metrics() -> Response:
    """Every metric of this process in the Prometheus text format."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


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
