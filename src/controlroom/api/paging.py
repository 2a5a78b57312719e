"""Paging as ServiceControl pages: ``page`` (from 1; below 1 reads as 1) and ``per_page``
(default 50; below 1 reads as 50, above 500 as 500), the total in the ``Total-Count``
header, a quoted ``ETag`` that changes when the answer changes (a request whose
``If-None-Match`` names it gets 304), and ``first``/``prev``/``next``/``last`` links in
``Link`` (relative to ``/api/``, as ServiceControl writes them). Every list route of the
API answers through ``paged_response``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import Depends, Query, Request, Response
from pydantic import BaseModel, TypeAdapter

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_PAGE = 10_000_000
"""Highest ``page`` accepted: beyond any real store, and it keeps the row offset in range."""


@dataclass(frozen=True, slots=True)
class Paging:
    """A page as the request asked for it, after ServiceControl's corrections."""

    page: int  # from 1
    per_page: int

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.per_page


def paging(
    page: Annotated[
        int,
        Query(le=MAX_PAGE, description="Page number, from 1; a value below 1 reads as 1."),
    ] = 1,
    per_page: Annotated[
        int,
        Query(
            description=f"Items per page: default {DEFAULT_PAGE_SIZE}; below 1 reads as "
            f"{DEFAULT_PAGE_SIZE}, above {MAX_PAGE_SIZE} as {MAX_PAGE_SIZE}."
        ),
    ] = DEFAULT_PAGE_SIZE,
) -> Paging:
    """The ``page`` and ``per_page`` query parameters (a FastAPI dependency)."""
    per_page = min(per_page, MAX_PAGE_SIZE) if per_page >= 1 else DEFAULT_PAGE_SIZE
    return Paging(page=max(page, 1), per_page=per_page)


PagingParams = Annotated[Paging, Depends(paging)]

TOTAL_COUNT_ESTIMATED = "Total-Count-Estimated"
"""Response header: ``true`` when ``Total-Count`` is the database's estimate (README,
Compatibility); absent when it is exact."""

LIST_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "headers": {
            "Total-Count": {"description": "Items over all pages.", "schema": {"type": "integer"}},
            "ETag": {
                "description": "Quoted; changes when the answer changes.",
                "schema": {"type": "string"},
            },
            "Link": {
                "description": 'Paging links, e.g. <errors?per_page=50&page=2>; rel="next"; '
                "only when there is more than one page.",
                "schema": {"type": "string"},
            },
        }
    },
    304: {"description": "Unchanged: If-None-Match named the current ETag."},
}


def paged_response(
    request: Request,
    items: Sequence[BaseModel],
    adapter: TypeAdapter[Any],
    page: Paging,
    total: int,
    *,
    estimated: bool = False,
) -> Response:
    """One page as JSON with ``Total-Count``, ``ETag`` and (when there is more than one
    page) ``Link``; 304 without a body when ``If-None-Match`` names the ETag. A ``HEAD``
    request gets the headers alone. An ``estimated`` total (the database's estimate, past
    the ``exact_count_limit`` setting) adds ``Total-Count-Estimated: true``; ``Total-Count``
    stays an integer and ``Link`` follows from it, so clients page as before."""
    body = adapter.dump_json(list(items), exclude_none=True)
    etag = _etag(body, total)
    headers = {"Total-Count": str(total), "ETag": etag}
    if estimated:
        headers[TOTAL_COUNT_ESTIMATED] = "true"
    links = paging_links(
        api_relative_path(request), dict(request.query_params), page.page, page.per_page, total
    )
    if links:
        headers["Link"] = links
    if _etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    if request.method == "HEAD":
        return Response(headers=headers, media_type="application/json")
    return Response(body, headers=headers, media_type="application/json")


def _etag(body: bytes, total: int) -> str:
    # The page and the total are the whole answer (Link follows from the total).
    digest = hashlib.sha256(body)
    digest.update(b"\x00%d" % total)
    return f'"{digest.hexdigest()[:32]}"'


def _etag_matches(if_none_match: str | None, etag: str) -> bool:
    if if_none_match is None:
        return False
    presented = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    return etag in presented or "*" in presented


def api_relative_path(request: Request) -> str:
    """The request's path relative to ``/api/``, URL-encoded (``endpoints/Sales/errors``)."""
    path: str = request.scope["path"]
    root = request.scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return quote(path.removeprefix("/api/"), safe="/")


def paging_links(path: str, query: dict[str, str], page: int, per_page: int, total: int) -> str:
    """ServiceControl's ``Link`` header value: ``<path?...&page=N>; rel="..."`` for
    ``first``, ``prev``, ``last`` and ``next`` as they apply; empty when everything fits
    on one page or ``page`` is past the last one. ``query`` keeps the request's other
    parameters; ``path`` is relative to ``/api/``, as ServiceControl writes it."""
    last = math.ceil(total / per_page)
    if last <= 1 or page > last:
        return ""
    others = {name: value for name, value in query.items() if name != "page"}
    others["per_page"] = str(per_page)
    wanted = []
    if page != 1:
        wanted += [(1, "first"), (page - 1, "prev")]
    if page != last:
        wanted += [(last, "last"), (page + 1, "next")]
    return ", ".join(
        f'<{path}?{urlencode({**others, "page": number})}>; rel="{rel}"' for number, rel in wanted
    )


def exact_count_limit(request: Request) -> int:
    """Up to how many matches lists count exactly (the ``exact_count_limit`` setting)."""
    limit: int = request.app.state.settings.exact_count_limit
    return limit
