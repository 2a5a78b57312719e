"""A failed message's body as an HTTP answer: its exact bytes and the headers it is
served with, for ``GET /api/messages/{id}/body`` and the console's body views alike."""

from __future__ import annotations

import re

from fastapi import HTTPException, Response

from controlroom.errors.ingest.bodies import BodyNotFoundError, BodyStore
from controlroom.errors.read.messages import StoredBody
from controlroom.exceptions import BodyStoreError

# The body is attacker-controlled: a browser must never run it as a page of the API's
# origin (text/html, SVG), so it is sandboxed, never sniffed, and offered as a download.
_BODY_SAFETY_HEADERS = {
    "x-content-type-options": "nosniff",
    "content-security-policy": "sandbox; default-src 'none'",
    "content-disposition": "attachment",
}
# An HTTP content coding (RFC 9110 token, or a list of them): only such a value is sent.
_CONTENT_CODING = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*")


def body_response_headers(content_type: str, content_encoding: str | None = None) -> dict[str, str]:
    """Headers of a body answer: the stored content type as stored (Starlette's
    ``media_type`` would append a charset), when it is a legal header value, else
    ``application/octet-stream``; the body's ``Content-Encoding`` when it has a legal one
    (the bytes are sent as stored, so the client decodes them); plus the safety headers."""
    legal = content_type.isprintable() and content_type.isascii()
    headers = {
        "content-type": content_type if legal else "application/octet-stream",
        **_BODY_SAFETY_HEADERS,
    }
    if content_encoding is not None and _CONTENT_CODING.fullmatch(content_encoding.strip()):
        headers["content-encoding"] = content_encoding.strip()
    return headers


def read_body_bytes(store: BodyStore, stored: StoredBody, message_id: object) -> bytes:
    """The exact bytes of a stored body (empty for an empty body): the body store's copy
    when it is stored externally, else the inline text as UTF-8. Raises ``HTTPException``
    404 (no store key, missing from the store, no body) or 503 (the store fails).
    ``message_id`` only names the message in those answers."""
    if stored.size == 0:
        return b""
    if stored.stored_externally:
        if stored.key is None:
            raise HTTPException(404, f"the body of failed message {message_id} has no store key")
        try:
            return store.get(stored.key)
        except BodyNotFoundError as exc:
            raise HTTPException(
                404, f"the body of failed message {message_id} is missing from the body store"
            ) from exc
        except BodyStoreError as exc:
            raise HTTPException(503, f"the body store cannot be read: {exc}") from exc
    if stored.text is None:
        raise HTTPException(404, f"failed message {message_id} has no body")
    return stored.text.encode("utf-8")


def packet_download(packet: bytes, rejected_id: str) -> Response:
    """A rejected telemetry packet (``rejected_id``: its UUID) as a download: its exact
    bytes as ``application/octet-stream``, never sniffed nor rendered, saved as
    ``rejected-<id>.json``."""
    headers = {
        **_BODY_SAFETY_HEADERS,
        "content-disposition": f'attachment; filename="rejected-{rejected_id}.json"',
    }
    return Response(packet, media_type="application/octet-stream", headers=headers)
