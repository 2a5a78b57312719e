"""Failure groups: classifiers, groups, a group's messages, comments, group archive,
acknowledging a group retry.

ServiceControl's routes and shapes (``/api/recoverability/...``): groups are query-time
aggregates counting Unresolved messages (``controlroom.errors.read.groups``); every group
carries ServiceControl's ``operation_*`` fields, from the group's retry when there is one
to show (running, or completed and not acknowledged), idle values otherwise (a group
archive is one statement, never in progress). Nulls are omitted from the JSON, as
ServiceControl does. Actions answer 202, as
ServiceControl does, although they are done when the answer is sent; an unknown group
id is 404, a non-UUID one 422.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Body, HTTPException, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, TypeAdapter

from controlroom.api.auth import current_principal
from controlroom.api.paging import LIST_RESPONSES, PagingParams, exact_count_limit, paged_response
from controlroom.api.parameters import FilterParams, OrderingParams, StoredText
from controlroom.api.views import FailedMessageListItem, UtcTimestamp, list_item
from controlroom.db.engine import begin_write
from controlroom.db.tables import FailedMessageStatus
from controlroom.errors import actions, activity
from controlroom.errors.read import groups
from controlroom.errors.read.lists import list_failed_messages
from controlroom.errors.retries.requests import UnknownGroup
from controlroom.runtime.clock import utc_now

router = APIRouter(tags=["recoverability"])

MAX_COMMENT_LENGTH = 4000
"""Longest group comment, in characters."""

GroupId = Annotated[
    uuid.UUID, Path(alias="groupId", description="The failure group's id (a UUID).")
]
Classifier = Annotated[
    str, Path(description="A classifier's name (see /recoverability/classifiers).")
]
ClassifierFilter = Annotated[
    str | None,
    Query(alias="classifierFilter", description="Only the group with exactly this title."),
]
GroupOrder = Annotated[
    str | None,
    Query(
        max_length=40,
        description="growth: the groups failing more now than half a day before first "
        "(Controlroom's); any other value: latest failure first (ServiceControl's order).",
    ),
]
GroupDirection = Annotated[
    str | None,
    Query(max_length=40, description="asc: the other way round; any other value: desc."),
]
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "No failed message belongs to a group with this id."}
}
_LIST_ADAPTER = TypeAdapter(list[FailedMessageListItem])


# --- response models ----------------------------------------------------------------------
class FailureGroupView(BaseModel):
    """One failure group (ServiceControl's ``GroupOperation``).

    ``count``, ``first`` and ``last`` are over the group's Unresolved messages (its
    Archived ones in the archive views); with ``count`` 0 ``first``/``last`` are omitted
    from a list and null in a group by id (``get_group_view``). The ``operation_*``
    fields describe a retry of the whole group (``operation_fields``):
    ``operation_status`` is ``"None"`` and ``need_user_acknowledgement`` false when idle.
    """

    id: str
    title: str
    type: str = Field(description="The classifier's name.")
    count: int
    first: UtcTimestamp | None = None
    last: UtcTimestamp | None = None
    comment: str | None = None
    operation_status: str = "None"
    operation_failed: bool | None = None
    operation_progress: float = 0.0
    operation_remaining_count: int | None = None
    operation_start_time: UtcTimestamp | None = None
    operation_completion_time: UtcTimestamp | None = None
    operation_messages_completed_count: int | None = None
    need_user_acknowledgement: bool = False
    # Controlroom's own fields (ServicePulse ignores them): failures in each of the last
    # 24 hours, oldest first, the current hour last; the newer half's minus the older's.
    failures_per_hour: list[int] | None = None
    growth: int | None = None


class GroupActionOutcome(BaseModel):
    """What a group action did."""

    changed: int = Field(description="Messages of the group this call changed.")


class CommentBody(BaseModel):
    comment: StoredText = Field(max_length=MAX_COMMENT_LENGTH)


# --- classifiers and groups ---------------------------------------------------------------
@router.get("/recoverability/classifiers")
def list_classifiers(response: Response) -> list[str]:
    """The classifiers' names, the default (``Exception Type and Stack Trace``) first."""
    response.headers["Total-Count"] = str(len(groups.CLASSIFIER_NAMES))
    return list(groups.CLASSIFIER_NAMES)


@router.get("/recoverability/groups", response_model_exclude_none=True)
@router.get("/recoverability/groups/", response_model_exclude_none=True, include_in_schema=False)
def list_default_groups(
    request: Request,
    response: Response,
    classifier_filter: ClassifierFilter = None,
    sort: GroupOrder = None,
    direction: GroupDirection = None,
) -> list[FailureGroupView]:
    """The groups of the default classifier (``Exception Type and Stack Trace``)."""
    return list_groups_view(
        request,
        response,
        groups.DEFAULT_CLASSIFIER,
        classifier_filter,
        archived=False,
        sort=group_sort(sort),
        descending=direction != "asc",
    )


@router.get(
    "/recoverability/groups/{classifier}",
    response_model_exclude_none=True,
    responses={404: {"description": "No classifier has this name."}},
)
def list_classifier_groups(
    request: Request,
    response: Response,
    classifier: Classifier,
    classifier_filter: ClassifierFilter = None,
    sort: GroupOrder = None,
    direction: GroupDirection = None,
) -> list[FailureGroupView]:
    """The groups of ``classifier`` that hold Unresolved messages, latest failure first
    (or by ``sort``)."""
    return list_groups_view(
        request,
        response,
        classifier,
        classifier_filter,
        archived=False,
        sort=group_sort(sort),
        descending=direction != "asc",
    )


def group_sort(sort: str | None) -> groups.GroupSort:
    """The groups' order ``sort`` asks for: ``growth``, else ServiceControl's (latest
    failure first), as it reads an unknown sort."""
    return "growth" if sort == "growth" else "last"


@router.get(
    "/recoverability/groups/id/{groupId}", response_model=FailureGroupView, responses=NOT_FOUND
)
def get_group(request: Request, group_id: GroupId) -> JSONResponse:
    """One group, counting its Unresolved messages."""
    return get_group_view(request, group_id, archived=False)


def list_group_errors(
    request: Request,
    group_id: GroupId,
    page: PagingParams,
    order: OrderingParams,
    where: FilterParams,
) -> Response:
    """The group's failed messages (every status unless ``status`` says otherwise), paged,
    sorted and filtered like ``/api/errors`` (``Total-Count``, ``ETag``, ``Link``)."""
    with _engine(request).connect() as conn:
        if not groups.group_exists(conn, str(group_id)):
            raise _unknown_group(group_id)
        result = list_failed_messages(
            conn,
            offset=page.offset,
            limit=page.per_page,
            where=replace(where, group_id=str(group_id)),
            order=order,
            exact_count_limit=exact_count_limit(request),
        )
    items = [list_item(summary) for summary in result.items]
    return paged_response(
        request, items, _LIST_ADAPTER, page, result.total, estimated=result.total_estimated
    )


_GROUP_ERRORS = "/recoverability/groups/{groupId}/errors"
_GROUP_ERRORS_RESPONSES = {**LIST_RESPONSES, **NOT_FOUND}
router.add_api_route(
    _GROUP_ERRORS,
    list_group_errors,
    methods=["GET"],
    response_model=list[FailedMessageListItem],
    responses=_GROUP_ERRORS_RESPONSES,
)
router.add_api_route(
    _GROUP_ERRORS, list_group_errors, methods=["HEAD"], responses=_GROUP_ERRORS_RESPONSES
)


# --- comments -----------------------------------------------------------------------------
@router.post(
    "/recoverability/groups/{groupId}/comment",
    status_code=202,
    response_class=Response,
    responses={**NOT_FOUND, 422: {"description": "No comment given, or it is too long."}},
)
def edit_comment(
    request: Request,
    group_id: GroupId,
    comment: Annotated[
        str | None,
        Query(max_length=MAX_COMMENT_LENGTH, description="The comment (ServiceControl's way)."),
    ] = None,
    body: Annotated[CommentBody | None, Body(description="Or the comment in a JSON body.")] = None,
) -> Response:
    """Set the group's comment, from the ``comment`` query parameter (as ServicePulse
    sends it) or a JSON body ``{"comment": "..."}``; replaces any earlier comment."""
    text = comment if comment is not None else body.comment if body is not None else None
    if text is None:
        raise HTTPException(
            422, "give the comment as query parameter 'comment' or JSON body {\"comment\": ...}"
        )
    now = utc_now()
    with begin_write(_engine(request)) as conn:
        if not groups.group_exists(conn, str(group_id)):
            raise _unknown_group(group_id)
        groups.set_comment(conn, str(group_id), text, now)
        activity.group_comment_changed(
            conn, str(group_id), by=current_principal(request).name, now=now, deleted=False
        )
    return Response(status_code=202)


@router.delete(
    "/recoverability/groups/{groupId}/comment",
    status_code=202,
    response_class=Response,
    responses=NOT_FOUND,
)
def delete_comment(request: Request, group_id: GroupId) -> Response:
    """Remove the group's comment (a group without one stays without one)."""
    with begin_write(_engine(request)) as conn:
        if not groups.group_exists(conn, str(group_id)):
            raise _unknown_group(group_id)
        if groups.delete_comment(conn, str(group_id)):  # none to delete: nothing happened
            by = current_principal(request).name
            activity.group_comment_changed(conn, str(group_id), by=by, now=utc_now(), deleted=True)
    return Response(status_code=202)


# --- group actions ------------------------------------------------------------------------
@router.post(
    "/recoverability/groups/{groupId}/errors/archive", status_code=202, responses=NOT_FOUND
)
def archive_group(request: Request, group_id: GroupId) -> GroupActionOutcome:
    """Archive every Unresolved message of the group, in one statement."""
    return _group_action(request, group_id, actions.archive_group)


@router.post(
    "/recoverability/groups/{groupId}/errors/unarchive", status_code=202, responses=NOT_FOUND
)
def unarchive_group(request: Request, group_id: GroupId) -> GroupActionOutcome:
    """Make every Archived message of the group Unresolved again, in one statement."""
    return _group_action(request, group_id, actions.unarchive_group)


@router.delete(
    "/recoverability/unacknowledgedgroups/{groupId}",
    response_class=Response,
    responses={404: {"description": "No completed retry of this group awaits acknowledgement."}},
)
def acknowledge_group_retry(request: Request, group_id: GroupId) -> Response:
    """Dismiss the group's completed retry: its group view no longer asks for
    acknowledgement (ServiceControl's route)."""
    if not actions.acknowledge_group_retry(_engine(request), str(group_id)):
        raise HTTPException(404, f"no completed retry of group {group_id} awaits acknowledgement")
    return Response(status_code=200)


# --- shared with the archive views --------------------------------------------------------
def list_groups_view(
    request: Request,
    response: Response,
    classifier: str,
    classifier_filter: str | None,
    *,
    archived: bool,
    sort: groups.GroupSort = "last",
    descending: bool = True,
) -> list[FailureGroupView]:
    """The groups of ``classifier`` counting Unresolved (or, ``archived``, Archived)
    messages, with ``Total-Count``, in ``groups.list_groups``'s order by ``sort`` and
    ``descending``. 404 for an unknown classifier.

    The Unresolved view shows each group's retry (``group_view``) and, first, the groups
    that hold no Unresolved message any more but have a retry to show: one running (its
    messages are RetryIssued now) or one completed and not acknowledged (ServiceControl's
    "closed" groups), so the operator follows it and dismisses its outcome.
    """
    if classifier not in groups.CLASSIFIER_NAMES:
        raise HTTPException(
            404,
            f"no classifier named {classifier!r}; "
            f"the classifiers are {', '.join(groups.CLASSIFIER_NAMES)}",
        )
    if classifier_filter == "undefined":  # what ServicePulse sends for "no filter"
        classifier_filter = None
    with _engine(request).connect() as conn:
        found = groups.list_groups(
            conn,
            classifier,
            status=_counted(archived),
            title=classifier_filter,
            sort=sort,
            descending=descending,
        )
        retries = {} if archived else groups.group_retries(conn)
        open_ids = {group.id for group in found}
        closed_retries = [
            retry
            for retry in retries.values()
            if retry.group_id not in open_ids
            and retry.classifier == classifier
            and classifier_filter in (None, retry.title)
        ]
        hourly = groups.failures_per_hour(
            conn, [retry.group_id for retry in closed_retries], utc_now()
        )
    closed = [closed_group_view(retry, hourly[retry.group_id]) for retry in closed_retries]
    views = closed + [
        group_view(group, retries.get(group.id), archived=archived) for group in found
    ]
    response.headers["Total-Count"] = str(len(views))
    return views


def get_group_view(request: Request, group_id: uuid.UUID, *, archived: bool) -> JSONResponse:
    """One group counting Unresolved (or Archived) messages; 404 when unknown.

    ``first`` and ``last`` are always there, null when the group has no message in the
    status: ServiceControl has no such answer (its view holds only groups with messages
    in the status, and a view's ``First``/``Last`` are never empty), and a key that comes
    and goes with the count would surprise a client more than a null. Other empty fields
    are left out, as in every group view."""
    with _engine(request).connect() as conn:
        group = groups.get_group(conn, str(group_id), status=_counted(archived))
        retry = None if archived else groups.group_retries(conn).get(str(group_id))
    if group is None:
        raise _unknown_group(group_id)
    view = group_view(group, retry, archived=archived)
    body = view.model_dump(mode="json", by_alias=True, exclude_none=True)
    return JSONResponse({"first": None, "last": None} | body)


def group_view(
    group: groups.GroupSummary, retry: groups.GroupRetry | None = None, *, archived: bool = False
) -> FailureGroupView:
    """The API shape of a group, with its retry's ``operation_*`` fields (idle values
    without one). An ``archived`` view shows no comment: ServiceControl's archived group
    views carry none."""
    view = FailureGroupView(
        id=group.id,
        title=group.title,
        type=group.classifier,
        count=group.count,
        first=group.first,
        last=group.last,
        comment=None if archived else group.comment,
        failures_per_hour=list(group.failures_per_hour),
        growth=group.growth,
    )
    return view if retry is None else view.model_copy(update=operation_fields(retry))


def closed_group_view(
    retry: groups.GroupRetry, failures_per_hour: Sequence[int]
) -> FailureGroupView:
    """A group without Unresolved messages, shown for its retry: ``count`` is 0 while
    the retry runs and the messages it sent once it completed (ServiceControl's); its
    ``failures_per_hour`` as any group's (they count every status)."""
    completed = retry.completed_at is not None
    view = FailureGroupView(
        id=retry.group_id,
        title=retry.title or "",
        type=retry.classifier or "",
        count=retry.forwarded_count if completed else 0,
        last=retry.completed_at,
        failures_per_hour=list(failures_per_hour),
        growth=groups.growth(failures_per_hour),
    )
    return view.model_copy(update=operation_fields(retry))


def operation_fields(retry: groups.GroupRetry) -> dict[str, Any]:
    """ServiceControl's ``operation_*`` fields of a group retry: ``Preparing`` (claiming
    messages, progress 0), ``Forwarding`` (progress = sent or skipped / claimed, 0..1),
    ``Completed`` (progress 1, awaiting ``need_user_acknowledgement``)."""
    fields: dict[str, Any] = {
        "operation_failed": retry.failed,
        "operation_start_time": retry.started_at,
    }
    if retry.completed_at is not None:
        return fields | {
            "operation_status": "Completed",
            "operation_progress": 1.0,
            "operation_remaining_count": 0,
            "operation_completion_time": retry.completed_at,
            "need_user_acknowledgement": True,
        }
    done = retry.forwarded_count + retry.skipped_count
    if retry.prepared_at is None or retry.message_count == 0:
        return fields | {"operation_status": "Preparing", "operation_progress": 0.0}
    return fields | {
        "operation_status": "Forwarding",
        "operation_progress": min(done / retry.message_count, 1.0),
        "operation_remaining_count": max(retry.message_count - done, 0),
    }


def _group_action(
    request: Request, group_id: uuid.UUID, action: Callable[..., int]
) -> GroupActionOutcome:
    try:
        changed = action(_engine(request), str(group_id), by=current_principal(request).name)
    except UnknownGroup:
        raise _unknown_group(group_id) from None
    return GroupActionOutcome(changed=changed)


def _counted(archived: bool) -> FailedMessageStatus:
    return FailedMessageStatus.ARCHIVED if archived else FailedMessageStatus.UNRESOLVED


def _unknown_group(group_id: uuid.UUID) -> HTTPException:
    return HTTPException(404, f"no failed message belongs to a group with id {group_id}")


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = request.app.state.engine
    return engine
