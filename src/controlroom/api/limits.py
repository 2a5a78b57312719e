"""Request bodies: bounded, authenticated before they are read, never echoed back
(docs/decisions.md "Request bodies are bounded and authenticated before they are read").

- ``BodySizeLimit``: a request whose ``Content-Length`` exceeds ``max_request_body_size``
  (bytes) is answered 413 before a byte of its body is read; a body sent without a length
  (chunked) is counted as it streams and answered 413 once it passes the limit.
- ``AuthenticateFirst``: the bearer token and the method's role are checked on the
  headers alone, before the route reads and parses the body (FastAPI reads the body
  before it runs dependencies), so an unauthenticated caller cannot make the process
  read and parse a large body.
- ``validation_error``: FastAPI's 422 handler echoes each invalid value (``input``);
  this one names the field and the rule only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi import HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlroom.api import auth


class RequestTooLarge(HTTPException):
    """The body passed the limit while it streamed: an ``HTTPException`` (413), so that
    FastAPI's body reader passes it on rather than calling it a parse error (400)."""


class BodySizeLimit:
    """413 for bodies over ``max_bytes`` (module docstring)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _send_json(send, 413, self._detail())
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise RequestTooLarge(413, self._detail())
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except RequestTooLarge:
            if not started:
                await _send_json(send, 413, self._detail())

    def _detail(self) -> str:
        return (
            f"the request body is larger than {self.max_bytes} bytes "
            "(setting max_request_body_size)"
        )


class AuthenticateFirst:
    """401/403 from the headers alone, before any route reads the body (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Only methods that carry a body: reads cost nothing to refuse later, and an
        # unmatched GET keeps its 404. Only the API's paths: the console (every other
        # path, ``web/console.py``) authenticates by its session cookie, which it checks
        # before reading a form (``web.common.actor``), not by a bearer token.
        if (
            scope["type"] == "http"
            and scope["method"] in ("POST", "PUT", "PATCH", "DELETE")
            and _is_api_path(scope)
        ):
            try:
                await auth.authorize(Request(scope))
            except HTTPException as refused:
                await _send_json(send, refused.status_code, refused.detail, refused.headers)
                return
        await self.app(scope, receive, send)


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    """422 naming each invalid field and the rule it broke, without the value sent."""
    assert isinstance(exc, RequestValidationError)
    errors: list[dict[str, Any]] = [
        {key: value for key, value in error.items() if key not in ("input", "url")}
        for error in exc.errors()
    ]
    return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)


def _is_api_path(scope: Scope) -> bool:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path == "/api" or path.startswith("/api/")


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_json(
    send: Send, status: int, detail: object, headers: Mapping[str, str] | None = None
) -> None:
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
