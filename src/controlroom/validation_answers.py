"""The 422 answer of a request that fails validation, shared by central's API and the
site agent's.

FastAPI's own answer echoes each bad value back (``input``, ``ctx``); a value holding an
unpaired surrogate cannot be encoded as UTF-8, so echoing it turns the 422 into a 500, and
a bad value is the client's text, not ours to render back (hardening review). This
answer keeps FastAPI's shape (``{"detail": [{"type", "loc", "msg"}]}``) without them; a
``loc`` part can be a key the client sent (an unknown field), so it is made encodable.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


async def validation_failed(request: Request, exc: Exception) -> JSONResponse:
    """422 naming each field at fault (its ``loc``) and why, never its value."""
    assert isinstance(exc, RequestValidationError)
    detail = [
        {
            "type": error["type"],
            "loc": [_encodable(part) for part in error["loc"]],
            "msg": error["msg"],
        }
        for error in exc.errors()
    ]
    return JSONResponse({"detail": detail}, status_code=422)


def _encodable(part: object) -> object:
    if isinstance(part, str):
        return part.encode("utf-8", "backslashreplace").decode("utf-8")
    return part


def install_validation_answer(app: FastAPI) -> None:
    """Answer ``app``'s validation failures with ``validation_failed``."""
    app.add_exception_handler(RequestValidationError, validation_failed)
