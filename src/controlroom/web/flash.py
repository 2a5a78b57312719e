"""The outcome of a console action, carried across its redirect (post/redirect/get).

Source: docs/decisions.md "Console actions answer with a redirect". Every console POST
answers 303 to a page; what the action did travels in a short-lived cookie the server
signed for the session (an HMAC-SHA256 under a key only this session's signer derives),
and the page it lands on shows it once and clears it. A link cannot carry an outcome
text of its own choosing, and nothing of the cookie is ever markup: templates
autoescape it. A reload of that page, or going back to it, sends nothing again.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import asdict, dataclass
from typing import Final, Literal

from starlette.requests import Request
from starlette.responses import Response

COOKIE_NAME: Final = "controlroom_flash"
LIFETIME_SECONDS: Final = 60
"""A flash not shown within this long (the redirect was not followed) is dropped."""
MAX_TEXT: Final = 1000
"""Characters kept of each text (a relay's sentence is far shorter)."""

Kind = Literal["notice", "error"]


@dataclass(frozen=True, slots=True)
class Flash:
    """What an action did: ``kind`` ``notice`` (it did it) or ``error`` (it did not);
    ``code`` a short outcome name (``Applied``, ``NotParked``), ``text`` one sentence,
    ``detail`` an optional second one. All plain text."""

    kind: Kind
    text: str
    code: str = ""
    detail: str = ""


def set_flash(response: Response, request: Request, key: bytes, flash: Flash) -> None:
    """Attach ``flash`` to ``response`` (a redirect), signed with ``key``."""
    fields = {name: value[:MAX_TEXT] for name, value in asdict(flash).items()}
    payload = json.dumps(fields, separators=(",", ":")).encode("utf-8")
    response.set_cookie(
        COOKIE_NAME,
        f"{_b64(payload)}.{_b64(_mac(key, payload))}",
        max_age=LIFETIME_SECONDS,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def read_flash(request: Request, key: bytes) -> Flash | None:
    """The flash ``request`` carries, ``None`` when absent, forged or unreadable."""
    cookie = request.cookies.get(COOKIE_NAME)
    if not cookie or "." not in cookie:
        return None
    encoded, _, signature = cookie.partition(".")
    try:
        payload, presented = _unb64(encoded), _unb64(signature)
        if not hmac.compare_digest(_mac(key, payload), presented):
            return None
        fields = json.loads(payload)
        kind = fields["kind"]
        if kind not in ("notice", "error"):
            return None
        return Flash(
            kind=kind,
            text=str(fields["text"]),
            code=str(fields.get("code", "")),
            detail=str(fields.get("detail", "")),
        )
    except (ValueError, KeyError, TypeError):
        return None


def clear_flash(response: Response) -> None:
    """Drop the flash: the page that showed it is its only reader."""
    response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")


def _mac(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, b"flash\x00" + payload, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
