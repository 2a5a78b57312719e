"""The failed-message query parameters of the API, read with ServiceControl's leniency:
``sort``/``direction``, ``status``, ``modified`` and ``queueaddress``, a failed message's
id in the path. Bad input is a 422 naming the parameter, in FastAPI's
``{"detail": [{"loc": [...], "msg": ...}]}`` shape.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Query, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import AfterValidator

from controlroom.errors.read.filter_text import parse_modified_range, parse_status_filter
from controlroom.errors.read.filters import DEFAULT_SORT, SORT_KEYS, FailedMessageFilter, Ordering
from controlroom.runtime.wire_text import is_wire_text_clean

FailedMessageId = Annotated[
    uuid.UUID, Path(alias="id", description="The failed message's id (UniqueMessageId).")
]


def invalid_parameter(location: str, name: str, value: object, message: str) -> Exception:
    """A 422 naming the parameter, in the shape of FastAPI's own validation errors."""
    return RequestValidationError(
        [{"type": "value_error", "loc": (location, name), "msg": message, "input": value}]
    )


def no_nul(location: str, name: str, value: str | None) -> str | None:
    """``value`` itself; raises a 422 naming the parameter when it holds a NUL."""
    # Stored text never holds NUL (PostgreSQL cannot), so such a value is a client error.
    if value is not None and "\x00" in value:
        raise invalid_parameter(location, name, value, "must not contain the NUL character")
    return value


def _refuse_unstorable(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain the NUL character")
    if not is_wire_text_clean(value):
        raise ValueError("must be Unicode text: half of a surrogate pair alone (a lone surrogate)")
    return value


StoredText = Annotated[str, AfterValidator(_refuse_unstorable)]
"""A text field of a JSON body that the store keeps or looks up: a NUL in it, or a lone
surrogate (JSON's ``"\\ud800"``, which no store keeps and no answer encodes), is a 422
naming the field, on every provider (PostgreSQL keeps no NUL in text). Not for an edited
message's body, which is bytes sent to a queue and may hold NUL."""


def no_nul_in_parameters(request: Request) -> None:
    """A router dependency of every ``/api`` route: a NUL in a path or query parameter is
    a 422 naming it (``no_nul``), before the route reads the store, where PostgreSQL
    would refuse it with nothing to name the parameter by."""
    path = request.path_params.items()
    for location, parameters in (("path", path), ("query", request.query_params.multi_items())):
        for name, value in parameters:
            if isinstance(value, str):
                no_nul(location, name, value)


def ordering(
    sort: Annotated[
        str | None,
        Query(
            max_length=200,
            description="Sort key: " + ", ".join(SORT_KEYS) + f"; empty or any other "
            f"value sorts by {DEFAULT_SORT} (ServiceControl's leniency). Ties are "
            "broken by id in the same direction.",
        ),
    ] = None,
    direction: Annotated[
        str | None,
        Query(max_length=200, description="asc or desc; any other value reads as desc."),
    ] = None,
) -> Ordering:
    """The ``sort`` and ``direction`` query parameters (a FastAPI dependency). Unknown
    values are the defaults, never a refusal: ServiceControl's ``GetSortInfo``."""
    key = next((known for known in SORT_KEYS if known == sort), DEFAULT_SORT)
    return Ordering(key=key, descending=direction != "asc")


def message_filter(
    status: Annotated[
        str | None,
        Query(
            max_length=200,
            description="Comma-separated statuses to include (unresolved, resolved, "
            "retryIssued, archived; any case); a '-' prefix excludes one, e.g. '-archived'.",
        ),
    ] = None,
    modified: Annotated[
        str | None,
        Query(
            max_length=200,
            description="Last-modified range '<ISO from>...<ISO to>', both bounds inclusive; "
            "a time without an offset is UTC; one side may be empty.",
            examples=["2026-01-01T00:00:00Z...2026-01-31T23:59:59Z"],
        ),
    ] = None,
    queueaddress: Annotated[
        str | None,
        Query(
            max_length=400,
            description="Only failures from this queue (any case); empty: no filter.",
        ),
    ] = None,
    queue_address_camel: Annotated[
        str | None,
        Query(alias="queueAddress", max_length=400, description="Same as queueaddress."),
    ] = None,
) -> FailedMessageFilter:
    """The ``status``, ``modified`` and ``queueaddress`` query parameters (a dependency).

    ServiceControl's leniency: unknown statuses are ignored, an empty queue address is no
    filter, and the address is also read as ``queueAddress``. Raises a 422 naming
    ``modified`` when it cannot be read.
    """
    address = queueaddress if queueaddress is not None else queue_address_camel
    where = FailedMessageFilter(queue_address=no_nul("query", "queueaddress", address) or None)
    if status is not None:
        included, excluded = parse_status_filter(status)
        where = replace(where, statuses=included, excluded_statuses=excluded)
    if modified is not None:
        try:
            start, end = parse_modified_range(modified)
        except ValueError as exc:
            raise invalid_parameter("query", "modified", modified, str(exc)) from None
        where = replace(where, modified_from=start, modified_to=end)
    return where


OrderingParams = Annotated[Ordering, Depends(ordering)]
FilterParams = Annotated[FailedMessageFilter, Depends(message_filter)]


def refuse_unknown_or_repeated(request: Request) -> None:
    """A router's dependency: on a read (GET, HEAD), raise a 422 naming the first query
    parameter the route does not take (its loc ``["query", name]``, the message listing
    those it takes), so that a misspelt filter or cursor is never silently ignored, and an
    ``HTTPException`` 400 ``"<name>: give it at most once"`` for the first it takes that
    is given more than once (each takes one value: which of several it read would be a
    guess). For Controlroom's own routes only: ServiceControl's ignore unknown
    parameters, and clients written for it send some (docs/decisions.md "Our own routes
    refuse a parameter they do not take")."""
    route = request.scope.get("route")
    if request.method not in ("GET", "HEAD") or not isinstance(route, APIRoute):
        return
    taken = _query_parameters(route.dependant)
    for name in request.query_params:
        if name not in taken:
            listed = ", ".join(sorted(taken)) or "none"
            raise invalid_parameter(
                "query", name, None, f"not a parameter of this route (it takes: {listed})"
            )
        if len(request.query_params.getlist(name)) > 1:
            raise HTTPException(400, f"{name}: give it at most once")


def _query_parameters(dependant: Dependant) -> set[str]:
    """The query parameters' names a route's ``dependant`` reads, its dependencies' too."""
    names = {field.alias for field in dependant.query_params}
    for dependency in dependant.dependencies:
        names |= _query_parameters(dependency)
    return names
