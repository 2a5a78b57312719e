"""The console's pages (GET): dashboard, failed messages, a message, groups, endpoints,
the progress fragments htmx polls, sign-in and the offline API docs.

Reads go through ``controlroom.errors.read`` and ``errors.retries.requests`` (no SQL
here). Query parameters that cannot be read answer 400 naming the parameter.
"""

from __future__ import annotations

import contextlib
import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import Response

from controlroom.db.providers import SearchTerms
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors import tracebacks
from controlroom.errors.ingest.headers import body_not_kept, content_encoding, task_queue
from controlroom.errors.ingest.search_terms import MIN_PREFIX_CHARS
from controlroom.errors.read import endpoints, groups
from controlroom.errors.read.counts import (
    count_by_status,
    count_failed_imports,
    count_unresolved_by_endpoint,
    count_unresolved_by_endpoint_instance,
)
from controlroom.errors.read.facets import python_task_facet
from controlroom.errors.read.filter_text import parse_modified_range, parse_status_filter
from controlroom.errors.read.filters import FailedMessageFilter, Ordering, SortKey
from controlroom.errors.read.lists import list_failed_messages
from controlroom.errors.read.messages import get_failed_message, get_stored_body
from controlroom.errors.read.search import search_failed_messages
from controlroom.errors.read.summaries import SearchPage
from controlroom.errors.retries import requests as retries
from controlroom.errors.retries.outcomes import count_failed_again
from controlroom.http.bodies import body_response_headers, read_body_bytes
from controlroom.notifications.queries import measure_kpis as notification_kpis
from controlroom.web.bodies import MAX_SHOWN_BYTES, view_body
from controlroom.web.charts import NOTIFICATIONS, kpi_charts
from controlroom.web.common import api_state, notice_count, render, safe_next, viewer
from controlroom.web.filters import span
from controlroom.web.session import Session
from controlroom.web.sitecall_pages import kpi_tiles_context

router = APIRouter(include_in_schema=False)

PAGE_SIZE = 50
STATUS_LABELS = {
    "unresolved": "Unresolved",
    "retryissued": "RetryIssued",
    "resolved": "Resolved",
    "archived": "Archived",
}
"""The list's status filter: its values, and their names in the console."""
SORTABLE: tuple[SortKey, ...] = (
    "time_of_failure",
    "message_type",
    "status",
    "time_sent",
    "modified",
)
Viewer = Annotated[Session, Depends(viewer)]


# --- dashboard ----------------------------------------------------------------------------
@router.get("/")
def dashboard(request: Request, session: Viewer) -> Response:
    with _engine(request).connect() as conn:
        figures, top_groups, by_endpoint = _dashboard_figures(conn, request)
        interval = span(api_state(request).settings.kpi.interval)
        trends = kpi_charts(conn, now=figures["now"], interval=interval)
        outbox_trends = kpi_charts(
            conn, now=figures["now"], source=NOTIFICATIONS, interval=interval
        )
    return render(
        request,
        "dashboard.html",
        {
            **figures,
            "groups": top_groups[:8],
            "endpoints": list(by_endpoint.items())[:10],
            "charts": trends,
            "notification_charts": outbox_trends,
        },
    )


@router.get("/live/dashboard")
def dashboard_figures(request: Request, session: Viewer) -> Response:
    """The dashboard's tiles alone; the dashboard polls them
    (docs/decisions.md "Live figures poll, and rest while the tab is hidden")."""
    with _engine(request).connect() as conn:
        figures, _, _ = _dashboard_figures(conn, request)
    return render(request, "_dashboard_live.html", figures)


def _dashboard_figures(
    conn: sa.Connection, request: Request
) -> tuple[dict[str, Any], list[groups.GroupSummary], dict[str, int]]:
    """The tiles' figures (failed messages, site calls, the notification outbox), the
    groups largest first and the unresolved count by endpoint."""
    # Largest first: the groups an operator should look at (the list is by last failure).
    top_groups = sorted(
        groups.list_groups(conn, groups.DEFAULT_CLASSIFIER), key=lambda group: -group.count
    )
    by_endpoint = count_unresolved_by_endpoint(conn)
    settings = api_state(request).settings
    site_calls = kpi_tiles_context(conn, settings)
    outbox = notification_kpis(
        conn,
        now=site_calls["now"],
        interval=settings.kpi.interval,
        stuck_threshold=settings.kpi.stuck_threshold,
    )
    figures = {
        "counts": count_by_status(conn),
        "group_count": len(top_groups),
        "endpoint_count": len(by_endpoint),
        "failed_imports": count_failed_imports(conn),
        "Status": FailedMessageStatus,
        **site_calls,
        "notification_kpis": outbox[""],
        # What serve's intakes last saw in their queues (the periodic report and health
        # read the depth): none where this process does not ingest.
        "intakes": [intake.state() for intake in api_state(request).intakes],
    }
    return figures, top_groups, by_endpoint


# --- failed messages ----------------------------------------------------------------------
@router.get("/messages")
def message_list(
    request: Request,
    session: Viewer,
    status: Annotated[str, Query(max_length=40)] = "unresolved",
    q: Annotated[str, Query(max_length=400)] = "",
    sort: Annotated[str, Query(max_length=40)] = "time_of_failure",
    direction: Annotated[str, Query(max_length=4)] = "desc",
    failed_from: Annotated[str, Query(alias="from", max_length=40)] = "",
    failed_to: Annotated[str, Query(alias="to", max_length=40)] = "",
    group: Annotated[str, Query(max_length=40)] = "",
    endpoint: Annotated[str, Query(max_length=400)] = "",
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
) -> Response:
    where = _message_filter(status, failed_from, failed_to, group, endpoint)
    if sort not in SORTABLE:
        raise HTTPException(400, f"sort must be one of {', '.join(SORTABLE)}")
    if direction not in ("asc", "desc"):
        raise HTTPException(400, "direction must be asc or desc")
    order = Ordering(key=sort, descending=direction == "desc")
    offset = (page - 1) * PAGE_SIZE
    limit = api_state(request).settings.exact_count_limit
    note = ""
    with _engine(request).connect() as conn:
        if q.strip():
            found = search_failed_messages(
                conn,
                q,
                offset=offset,
                limit=PAGE_SIZE,
                order=order,
                where=where,
                exact_count_limit=limit,
                widen=True,
            )
            total, items = found.total, [hit.summary for hit in found.items]
            estimated = found.total_estimated
            note = search_note(found, status=STATUS_LABELS.get(status))
        else:
            listed = list_failed_messages(
                conn,
                offset=offset,
                limit=PAGE_SIZE,
                where=where,
                order=order,
                exact_count_limit=limit,
            )
            total, items, estimated = listed.total, listed.items, listed.total_estimated
        group_info = groups.get_group(conn, group) if group else None
        python_tasks = python_task_facet(conn)
    params = {
        "status": status,
        "q": q,
        "sort": sort,
        "direction": direction,
        "from": failed_from,
        "to": failed_to,
        "group": group,
        "endpoint": endpoint,
    }
    return render(
        request,
        "messages.html",
        {
            "items": items,
            "total": total,
            "total_estimated": estimated,
            "page": page,
            "pages": max(1, math.ceil(total / PAGE_SIZE)),
            "params": params,
            "status_labels": STATUS_LABELS,
            "group_info": group_info,
            "python_tasks": python_tasks,
            "search_note": note,
            "operation_id": request.query_params.get("operation", ""),
            "notice": _notice(request),
        },
    )


def search_note(found: SearchPage, status: str | None = None) -> str:
    """What the console says about a search's page: which words were looked for as the
    start of a word because nothing held them whole, or why nothing matched (every word
    must occur; a word ending in ``*`` is the start of a word; ``status``, the status
    the list is narrowed to, named: the list opens on Unresolved). Empty when the search
    found its words as written."""
    if found.widened and found.total:
        words = _quoted(found.widened)
        if len(found.widened) == 1:
            return (
                f"No message contains {words} as a whole word; showing messages with a word "
                "starting with it."
            )
        # Each word may occur whole on its own: only all of them together did not.
        return (
            f"No message contains {words} together as whole words; showing messages with "
            "words starting with them."
        )
    if found.total:
        return ""
    query = found.query
    narrowed = (
        f" Only {status} messages were searched: choose Any status to search them all."
        if status
        else ""
    )
    if query is None or query.empty:
        return (
            "Nothing matched: the search has no letter or digit, and no message has it as its "
            f"id.{narrowed}"
        )
    (terms,) = query.alternatives or (SearchTerms(),)
    wanted = [f"the word {_quoted([word])}" for word in terms.words]
    wanted += [f"a word starting with {_quoted([prefix])}" for prefix in terms.prefixes]
    together = f"all of: {'; '.join(wanted)}" if len(wanted) > 1 else wanted[0]
    return (
        f"Nothing matched: no message contains {together}. Every word must occur in "
        f"one message; end a word of {MIN_PREFIX_CHARS} or more characters with * to find "
        f"the words that start with it.{narrowed}"
    )


def _quoted(words: Sequence[str]) -> str:
    return ", ".join(f"“{word}”" for word in words)


@router.get("/messages/{failed_message_id}")
def message_page(request: Request, session: Viewer, failed_message_id: uuid.UUID) -> Response:
    context = _message_context(request, failed_message_id)
    context["operation_id"] = request.query_params.get("operation", "")
    context["notice"] = _notice(request)
    return render(request, "message.html", context)


@router.get("/messages/{failed_message_id}/state")
def message_state(request: Request, session: Viewer, failed_message_id: uuid.UUID) -> Response:
    """The status panel alone; htmx polls it while a retry is pending."""
    return render(request, "_message_state.html", _message_context(request, failed_message_id))


@router.get("/messages/{failed_message_id}/body/view")
def body_view(request: Request, session: Viewer, failed_message_id: uuid.UUID) -> Response:
    """The body, decoded and pretty-printed (fetched on demand when stored externally)."""
    with _engine(request).connect() as conn:
        details = get_failed_message(conn, str(failed_message_id))
        stored = get_stored_body(conn, str(failed_message_id))
    if details is None or stored is None:
        raise HTTPException(404, f"no failed message with id {failed_message_id}")
    if stored.not_kept is not None:
        context = {"not_kept": stored.not_kept, "id": str(failed_message_id)}
        return render(request, "_body.html", context)
    data = read_body_bytes(api_state(request).body_store, stored, failed_message_id)
    headers = json.loads(details.headers_json)
    view = view_body(data, stored.content_type, content_encoding(headers), task_queue(headers))
    return render(request, "_body.html", {"body": view, "id": str(failed_message_id)})


@router.get("/messages/{failed_message_id}/body")
def body_download(request: Request, session: Viewer, failed_message_id: uuid.UUID) -> Response:
    """The exact stored bytes, as a download (never rendered by the browser)."""
    with _engine(request).connect() as conn:
        stored = get_stored_body(conn, str(failed_message_id))
    if stored is None:
        raise HTTPException(404, f"no failed message with id {failed_message_id}")
    if stored.not_kept is not None:
        raise HTTPException(404, f"the body was not kept: {stored.not_kept}")
    data = read_body_bytes(api_state(request).body_store, stored, failed_message_id)
    headers = body_response_headers(stored.content_type)
    headers["content-disposition"] = f'attachment; filename="{failed_message_id}.body"'
    return Response(content=data, headers=headers)


@router.get("/messages/{failed_message_id}/edit")
def edit_page(request: Request, session: Viewer, failed_message_id: uuid.UUID) -> Response:
    """The edit form, or, for a body above ``MAX_SHOWN_BYTES`` (the body viewer's limit),
    a page offering retry without edit and the download (the body is not read)."""
    context = _message_context(request, failed_message_id)
    context["too_large"] = context["message"].body_size > MAX_SHOWN_BYTES
    context["limit"] = MAX_SHOWN_BYTES
    context["body_text"] = None
    if not context["too_large"]:
        with _engine(request).connect() as conn:
            stored = get_stored_body(conn, str(failed_message_id))
        assert stored is not None
        data = read_body_bytes(api_state(request).body_store, stored, failed_message_id)
        with contextlib.suppress(UnicodeDecodeError):  # binary bodies are not edited as text
            context["body_text"] = data.decode("utf-8")
    context["headers_text"] = json.dumps(context["headers"], indent=2, ensure_ascii=False)
    context["can_send"] = api_state(request).transport is not None
    return render(request, "edit.html", context)


# --- retry operations ---------------------------------------------------------------------
@router.get("/operations/{operation_id}")
def operation_progress(request: Request, session: Viewer, operation_id: uuid.UUID) -> Response:
    """A retry operation's progress; the fragment polls itself until it is complete."""
    with _engine(request).connect() as conn:
        operation = retries.get_operation(conn, str(operation_id))
    if operation is None:
        raise HTTPException(404, f"no retry operation with id {operation_id}")
    return render(request, "_operation.html", {"operation": operation})


# --- groups -------------------------------------------------------------------------------
@router.get("/groups")
def group_list(
    request: Request,
    session: Viewer,
    classifier: Annotated[str, Query(max_length=200)] = groups.DEFAULT_CLASSIFIER,
    sort: Annotated[str, Query(max_length=40)] = "last",
    fragment: bool = False,
) -> Response:
    if classifier not in groups.CLASSIFIER_NAMES:
        raise HTTPException(400, f"classifier must be one of {', '.join(groups.CLASSIFIER_NAMES)}")
    order: groups.GroupSort = "growth" if sort == "growth" else "last"
    with _engine(request).connect() as conn:
        found = groups.list_groups(conn, classifier, sort=order)
        running = groups.group_retries(conn)
        failed_again = {
            retry.group_id: count_failed_again(conn, retry.operation_id, retry.started_at)
            for retry in running.values()
            if retry.completed_at is not None
        }
    shown = {group.id for group in found}
    # A group whose messages are all being retried has no Unresolved message left; its
    # retry is shown until the operator's next look after it completed (as the API does).
    closed = [
        retry
        for retry in running.values()
        if retry.group_id not in shown and retry.classifier == classifier
    ]
    context = {
        "groups": found,
        "closed": closed,
        "retries": running,
        "failed_again": failed_again,
        "classifier": classifier,
        "sort": order,
        "classifiers": groups.CLASSIFIER_NAMES,
        "busy": any(retry.completed_at is None for retry in running.values()),
        "notice": _notice(request),
    }
    return render(request, "_groups_table.html" if fragment else "groups.html", context)


# --- endpoints ----------------------------------------------------------------------------
@router.get("/endpoints")
def endpoint_list(
    request: Request, session: Viewer, page: Annotated[int, Query(ge=1, le=1_000_000)] = 1
) -> Response:
    with _engine(request).connect() as conn:
        known = endpoints.list_known_endpoints(conn, offset=(page - 1) * PAGE_SIZE, limit=PAGE_SIZE)
        failures = count_unresolved_by_endpoint_instance(conn)
    return render(
        request,
        "endpoints.html",
        {
            "endpoints": known.items,
            "total": known.total,
            "page": page,
            "pages": max(1, math.ceil(known.total / PAGE_SIZE)),
            "failures": failures,
        },
    )


# --- sign-in and docs ---------------------------------------------------------------------
_SIGN_IN_REFUSALS = {
    "1": "That token is not valid.",
    "site": "That token is a site's: it posts telemetry and cannot sign in.",
}

@router.get("/signin")
def sign_in_page(
    request: Request,
    next: Annotated[str, Query(max_length=2000)] = "/",
    refused: Annotated[str, Query(max_length=4)] = "",
) -> Response:
    """The sign-in form; ``refused=1`` after a token that is not valid, ``refused=site``
    after a site's token (each a fixed text)."""
    error = _SIGN_IN_REFUSALS.get(refused)
    return render(request, "signin.html", {"next": safe_next(next), "error": error})


@router.get("/docs")
def docs(request: Request) -> Response:
    """Swagger UI over ``/openapi.json``, every asset from the package (works offline)."""
    return render(request, "docs.html", {"openapi_url": "/openapi.json"})


# --- helpers ------------------------------------------------------------------------------
def _message_filter(
    status: str, failed_from: str, failed_to: str, group: str, endpoint: str
) -> FailedMessageFilter:
    where = FailedMessageFilter()
    if status:
        try:
            included, excluded = parse_status_filter(status)
        except ValueError as exc:
            raise HTTPException(400, f"status: {exc}") from None
        where = replace(where, statuses=included, excluded_statuses=excluded)
    if failed_from or failed_to:
        try:
            start, end = parse_modified_range(f"{failed_from}...{failed_to}")
        except ValueError as exc:
            raise HTTPException(400, f"time of failure (from/to): {exc}") from None
        where = replace(where, failed_from=start, failed_to=end)
    if group:
        try:
            where = replace(where, group_id=str(uuid.UUID(group)))
        except ValueError:
            raise HTTPException(400, "group must be a group id (a UUID)") from None
    if endpoint:
        where = replace(where, receiving_endpoint=endpoint)
    return where


def _message_context(request: Request, failed_message_id: uuid.UUID) -> dict[str, Any]:
    with _engine(request).connect() as conn:
        details = get_failed_message(conn, str(failed_message_id))
    if details is None:
        raise HTTPException(404, f"no failed message with id {failed_message_id}")
    headers = json.loads(details.headers_json)
    trace = details.summary.stack_trace
    return {
        "message": details,
        "summary": details.summary,
        "headers": headers,
        "Status": FailedMessageStatus,
        "inline_body": details.body_size <= 64 * 1024,
        "task_queue": task_queue(headers),
        "not_kept": body_not_kept(headers) if details.body_size == 0 else None,
        "traceback": tracebacks.parse_traceback(
            trace, headers.get("NServiceBus.ExceptionInfo.Message")
        )
        if trace
        else None,
        "frame_runs": tracebacks.frame_runs,
    }


_NOTICES = {
    "archived": "Archived {n} message(s).",
    "unarchived": "Unarchived {n} message(s).",
    "retried": "Retry requested for {n} message(s).",
    "edited": "The edited message was sent; the original is Resolved.",
    "group-archived": "Archived {n} message(s) of the group.",
    "acknowledged": "The group's last retry was dismissed.",
    "monitored": "Endpoint updated.",
    "nothing": "Nothing was selected.",
}


_LEFT_NOTICES = {
    "archived": "; {left} left as it was: only Unresolved messages are archived.",
    "unarchived": "; {left} left as it was: only Archived messages are unarchived.",
}
"""What a by-id action adds when it left some of the selected messages unchanged."""


def _notice(request: Request) -> str | None:
    """The outcome of the action that redirected here: fixed texts, only counts from
    the URL (no text from a link is ever shown)."""
    done = request.query_params.get("done", "")
    template = _NOTICES.get(done)
    if template is None:
        return None
    text = template.format(n=notice_count(request.query_params.get("n", "0")))
    left = notice_count(request.query_params.get("left", "0"))
    if left and done in _LEFT_NOTICES:
        text = text.removesuffix(".") + _LEFT_NOTICES[done].format(left=left)
    return text


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = api_state(request).engine
    return engine
