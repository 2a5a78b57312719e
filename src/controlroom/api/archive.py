"""Archive, unarchive and resolve failed messages; the archived-group views.

ServiceControl's routes: ``POST|PATCH /api/errors/archive`` (a JSON list of ids; also
with a trailing slash), ``POST|PATCH /api/errors/{id}/archive``, ``PATCH
/api/errors/unarchive``, ``PATCH /api/errors/{from}...{to}/unarchive``, ``PATCH
/api/pendingretries/resolve``, ``PATCH /api/pendingretries/queues/resolve``, ``GET
/api/errors/groups/{classifier}`` and ``GET /api/archive/groups/id/{groupId}``.

Each action is one set-based statement in one transaction
(``controlroom.errors.read.operations``) and answers 202 (ServiceControl's code) with what it
did: ``{"changed": n, "unchanged_ids": [...]}``, where an unchanged id names a message
that exists but is not in the status the action applies to (archive: Unresolved;
unarchive: Archived; resolve: RetryIssued or Unresolved).

Unknown ids are never ignored: a single id that names no failed message is 404; a list
with any such id is refused whole with 422 ``{"detail": ..., "unknown_ids": [...]}`` and
changes nothing, so the caller can correct the list and send it again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Annotated, Any, Protocol, TypeVar

import sqlalchemy as sa
from fastapi import APIRouter, Body, HTTPException, Path, Request, Response
from fastapi.responses import JSONResponse
from pydantic import AliasChoices, BaseModel, Field, model_validator

from controlroom.api.auth import current_principal
from controlroom.api.parameters import FailedMessageId, StoredText
from controlroom.api.recoverability import (
    Classifier,
    ClassifierFilter,
    FailureGroupView,
    GroupId,
    get_group_view,
    list_groups_view,
)
from controlroom.db.engine import run_write_transaction
from controlroom.errors import actions
from controlroom.errors.read import groups, operations
from controlroom.errors.read.filter_text import parse_modified_range, utc_instant
from controlroom.runtime.clock import utc_now

router = APIRouter(tags=["archive"])

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


class _ByIdAction(Protocol):
    def __call__(
        self, engine: sa.Engine, ids: list[str], *, by: str
    ) -> operations.StatusChange: ...


IdList = Annotated[
    list[uuid.UUID],
    Body(
        max_length=operations.MAX_IDS_PER_REQUEST,
        description="Ids of failed messages (UniqueMessageId), as a JSON list.",
    ),
]


# --- models -------------------------------------------------------------------------------
class ActionOutcome(BaseModel):
    """What an archive, unarchive or resolve did."""

    changed: int = Field(description="Messages this call moved to the action's status.")
    unchanged_ids: list[str] = Field(
        default_factory=list,
        description="Ids of messages that exist but are not in the status the action "
        "applies to; left as they were.",
    )


class UnknownIds(BaseModel):
    """The answer to a list with ids that name no failed message (nothing was changed)."""

    detail: str
    unknown_ids: list[str]


class ResolveRequest(BaseModel):
    """Which pending retries to resolve: ``uniquemessageids`` (ServiceControl's name;
    ``ids`` also accepted), or a ``from``/``to`` range of ``last_modified`` (ISO 8601,
    both inclusive; a time without a zone is UTC)."""

    uniquemessageids: list[uuid.UUID] | None = Field(
        default=None,
        max_length=operations.MAX_IDS_PER_REQUEST,
        validation_alias=AliasChoices("uniquemessageids", "ids"),
    )
    from_: datetime | None = Field(default=None, alias="from")
    to: datetime | None = None

    @model_validator(mode="after")
    def _ids_or_range(self) -> ResolveRequest:
        has_range = self.from_ is not None or self.to is not None
        if self.uniquemessageids is not None and has_range:
            raise ValueError("give either 'uniquemessageids' or 'from' and 'to', not both")
        if self.uniquemessageids is None:
            if self.from_ is None or self.to is None:
                raise ValueError("give 'uniquemessageids', or both 'from' and 'to'")
            self.from_, self.to = utc_instant(self.from_, "from"), utc_instant(self.to, "to")
            if self.from_ > self.to:
                raise ValueError("'from' is after 'to'")
        return self


class QueueWindow(BaseModel):
    """ServiceControl's ``PendingRetryRequest`` / ``QueueModel``: a queue address and a
    ``from``/``to`` range of ``last_modified`` (ISO 8601, both inclusive; a time without a
    zone is UTC). Read leniently, as ServiceControl reads it; checked by ``window``."""

    queueaddress: StoredText | None = None
    # Python's fromisoformat reads past a NUL after the time: refused here, by name.
    from_: StoredText | None = Field(default=None, alias="from")
    to: StoredText | None = None

    def window(self) -> tuple[str, datetime, datetime]:
        """``(queue address, from, to)``; raises ``HTTPException`` 400 naming the field."""
        if self.queueaddress is None or not self.queueaddress.strip():
            raise HTTPException(400, "queueaddress must not be blank")
        try:
            start, end = parse_modified_range(f"{self.from_ or ''}...{self.to or ''}")
        except ValueError as exc:
            raise HTTPException(400, f"from/to: {exc}") from None
        if start is None or end is None:
            raise HTTPException(400, "from/to: both times are needed")
        return self.queueaddress, start, end


REFUSED = {422: {"model": UnknownIds, "description": "Some ids name no failed message."}}


# --- archive and unarchive ----------------------------------------------------------------
def _route(
    path: str, methods: Sequence[str], *, slash: bool = False, **options: Any
) -> Callable[[Endpoint], Endpoint]:
    """Register ``path`` once per method, each with its own operation id (one route for
    POST and PATCH would give both the same id), and with ``slash`` also ``path + "/"``
    out of the schema (ServicePulse sends ``errors/archive/``)."""

    def register(endpoint: Endpoint) -> Endpoint:
        for method in methods:
            operation_id = f"{endpoint.__name__}_{method.lower()}"
            router.add_api_route(
                path, endpoint, methods=[method], operation_id=operation_id, **options
            )
            if slash:
                router.add_api_route(
                    path + "/", endpoint, methods=[method], include_in_schema=False, **options
                )
        return endpoint

    return register


# A refusal is a JSONResponse, so each by-id route names its response model explicitly.
BY_IDS: dict[str, Any] = {"status_code": 202, "response_model": ActionOutcome, "responses": REFUSED}


@_route("/errors/archive", ["POST", "PATCH"], slash=True, **BY_IDS)
def archive_messages(request: Request, ids: IdList) -> ActionOutcome | JSONResponse:
    """Archive the Unresolved messages among ``ids``."""
    return _by_ids(request, ids, actions.archive_messages)


@_route(
    "/errors/{id}/archive",
    ["POST", "PATCH"],
    status_code=202,
    responses={404: {"description": "No failed message has this id."}},
)
def archive_message(request: Request, failed_message_id: FailedMessageId) -> ActionOutcome:
    """Archive one message (when it is Unresolved)."""
    outcome = actions.archive_messages(
        _engine(request), [str(failed_message_id)], by=_caller(request)
    )
    if outcome.refused:
        raise HTTPException(404, f"no failed message with id {failed_message_id}")
    return ActionOutcome(changed=len(outcome.changed), unchanged_ids=outcome.unchanged)


@_route("/errors/unarchive", ["PATCH"], slash=True, **BY_IDS)
def unarchive_messages(request: Request, ids: IdList) -> ActionOutcome | JSONResponse:
    """Make the Archived messages among ``ids`` Unresolved again."""
    return _by_ids(request, ids, actions.unarchive_messages)


@router.patch(
    "/errors/{range}/unarchive",
    status_code=202,
    response_model=ActionOutcome,
    responses={400: {"description": "The range is not '<ISO from>...<ISO to>'."}},
)
def unarchive_between(
    request: Request,
    time_range: Annotated[
        str,
        Path(
            alias="range",
            max_length=200,
            description="'<ISO from>...<ISO to>' of last_modified, both inclusive.",
        ),
    ],
) -> ActionOutcome:
    """Make the Archived messages last modified within the range Unresolved again
    (ServiceControl's ``PATCH errors/{from}...{to}/unarchive``)."""
    try:
        start, end = parse_modified_range(time_range)
    except ValueError as exc:
        raise HTTPException(400, f"range: {exc}") from None
    if start is None or end is None:
        raise HTTPException(400, "range: both times are needed")
    changed = run_write_transaction(
        _engine(request), lambda conn: operations.unarchive_between(conn, start, end, utc_now())
    )
    return ActionOutcome(changed=changed)


# --- resolve ------------------------------------------------------------------------------
@router.patch("/pendingretries/resolve", **BY_IDS)
def resolve_pending_retries(request: Request, body: ResolveRequest) -> ActionOutcome | JSONResponse:
    """Mark pending retries (RetryIssued messages, and Unresolved ones never retried)
    Resolved: by id, or every one whose ``last_modified`` is within ``from``..``to``.
    Their retry claims are dropped."""
    if body.uniquemessageids is not None:
        return _by_ids(request, body.uniquemessageids, actions.resolve_pending_retries)
    start, end = body.from_, body.to
    assert start is not None and end is not None  # the model's validator
    changed = run_write_transaction(
        _engine(request),
        lambda conn: operations.resolve_pending_retries_between(conn, start, end, utc_now()),
    )
    return ActionOutcome(changed=changed)


@router.patch("/pendingretries/queues/resolve", status_code=202, response_model=ActionOutcome)
def resolve_queue_pending_retries(request: Request, body: QueueWindow) -> ActionOutcome:
    """Resolve the pending retries (and never-retried Unresolved messages) that failed in
    ``queueaddress`` and were last modified within ``from``..``to``. 400 naming the field
    when the queue is blank or a time cannot be read."""
    queue_address, start, end = body.window()
    changed = run_write_transaction(
        _engine(request),
        lambda conn: operations.resolve_pending_retries_between(
            conn, start, end, utc_now(), queue_address=queue_address
        ),
    )
    return ActionOutcome(changed=changed)


# --- archived groups ----------------------------------------------------------------------
@router.get("/errors/groups", response_model_exclude_none=True)
@router.get("/errors/groups/", response_model_exclude_none=True, include_in_schema=False)
def list_default_archived_groups(
    request: Request, response: Response, classifier_filter: ClassifierFilter = None
) -> list[FailureGroupView]:
    """Groups of the default classifier, counting their Archived messages."""
    return list_groups_view(
        request, response, groups.DEFAULT_CLASSIFIER, classifier_filter, archived=True
    )


@router.get(
    "/errors/groups/{classifier}",
    response_model_exclude_none=True,
    responses={404: {"description": "No classifier has this name."}},
)
def list_archived_groups(
    request: Request,
    response: Response,
    classifier: Classifier,
    classifier_filter: ClassifierFilter = None,
) -> list[FailureGroupView]:
    """The groups of ``classifier`` that hold Archived messages, counting those."""
    return list_groups_view(request, response, classifier, classifier_filter, archived=True)


@router.get(
    "/archive/groups/id/{groupId}",
    response_model=FailureGroupView,
    responses={404: {"description": "No failed message belongs to a group with this id."}},
)
def get_archived_group(request: Request, group_id: GroupId) -> JSONResponse:
    """One group, counting its Archived messages."""
    return get_group_view(request, group_id, archived=True)


# --- helpers ------------------------------------------------------------------------------
def _by_ids(
    request: Request, ids: list[uuid.UUID], action: _ByIdAction
) -> ActionOutcome | JSONResponse:
    outcome = action(_engine(request), [str(item) for item in ids], by=_caller(request))
    if outcome.refused:
        # Nothing was written (the action checks before it updates); say which ids.
        refusal = UnknownIds(
            detail=f"{len(outcome.unknown)} of the ids name no failed message; nothing was changed",
            unknown_ids=outcome.unknown,
        )
        return JSONResponse(refusal.model_dump(), status_code=422)
    return ActionOutcome(changed=len(outcome.changed), unchanged_ids=outcome.unchanged)


def _caller(request: Request) -> str:
    return current_principal(request).name


def _engine(request: Request) -> sa.Engine:
    engine: sa.Engine = request.app.state.engine
    return engine
