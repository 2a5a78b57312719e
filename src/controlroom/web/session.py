"""Console sessions: a signed cookie naming the signed-in token, and its CSRF token.

The API authenticates each request by its bearer token (``controlroom.api.auth``); a
browser cannot attach one to a link or a form, so the console signs in once with a token
and keeps a session cookie instead:

- The cookie holds ``{name, issued, csrf}`` (JSON, base64url) and an HMAC-SHA256 of it.
  The key is derived from the named token's secret, so a session dies with its token
  (removed or replaced in the settings), survives a restart and is valid in every process
  that has the same tokens. With no token configured (the open API) the console acts as
  ``ANONYMOUS`` and signs with a key made at start-up.
- It is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page
  sends it), ``Path=/``, ``Secure`` on HTTPS, and lives ``SESSION_SECONDS``.
- ``csrf`` is random per session; every state-changing console request must echo it
  (form field ``csrf_token`` or header ``X-CSRF-Token``), compared in constant time.
  Pages carry it masked, differently in every answer (``mask_csrf_token``): answers are
  compressed, and a secret repeated unchanged beside text an attacker chose could be
  read from their compressed lengths (BREACH; docs/decisions.md "Compressed answers and
  the CSRF token").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Final

from starlette.requests import Request
from starlette.responses import Response

from controlroom.http.auth import ANONYMOUS, Principal, TokenTable

COOKIE_NAME: Final = "controlroom_session"
SESSION_SECONDS: Final = 12 * 3600
CSRF_FIELD: Final = "csrf_token"
CSRF_HEADER: Final = "x-csrf-token"
_KEY_LABEL: Final = b"controlroom console session v1\x00"


@dataclass(frozen=True, slots=True)
class Session:
    """A valid session: who, and the CSRF token its forms must carry."""

    principal: Principal
    csrf_token: str
    issued_at: int  # Unix seconds


class SessionSigner:
    """Makes and checks session cookies for one app's token table."""

    def __init__(self, tokens: TokenTable) -> None:
        self._tokens = tokens
        # Only used when no token is configured: sessions of the open console then last
        # as long as the process, which is all the CSRF token needs.
        self._open_key = secrets.token_bytes(32)

    @property
    def open(self) -> bool:
        """True when no token is configured: everyone is ``ANONYMOUS`` (admin)."""
        return self._tokens.open

    def new_session(self, principal: Principal) -> Session:
        return Session(principal, secrets.token_urlsafe(32), int(time.time()))

    def encode(self, session: Session) -> str:
        payload = json.dumps(
            {"n": session.principal.name, "i": session.issued_at, "c": session.csrf_token},
            separators=(",", ":"),
        ).encode("utf-8")
        key = self._key(session.principal.name)
        assert key is not None  # sessions are only made for known principals
        return f"{_b64(payload)}.{_b64(_mac(key, payload))}"

    def decode(self, cookie: str | None) -> Session | None:
        """The session ``cookie`` carries, ``None`` when absent, forged, expired, or its
        token is no longer configured."""
        if not cookie or "." not in cookie:
            return None
        encoded, _, signature = cookie.partition(".")
        try:
            payload = _unb64(encoded)
            presented = _unb64(signature)
            fields = json.loads(payload)
            name, issued, csrf = str(fields["n"]), int(fields["i"]), str(fields["c"])
        except (ValueError, KeyError, TypeError):
            return None
        key = self._key(name)
        if key is None or not hmac.compare_digest(_mac(key, payload), presented):
            return None
        if not 0 <= time.time() - issued < SESSION_SECONDS:
            return None
        principal = ANONYMOUS if self.open else self._principal(name)
        if principal is None:
            return None
        return Session(principal, csrf, issued)

    def flash_key(self, session: Session) -> bytes:
        """The key ``web/flash.py`` signs this session's action outcomes with: derived
        from the session's own key and its CSRF token, so another session's flash (or
        one made without the key) is not read."""
        key = self._key(session.principal.name)
        assert key is not None  # a decoded session's principal is known
        return _mac(key, b"flash key\x00" + session.csrf_token.encode("ascii"))

    def _key(self, name: str) -> bytes | None:
        if self.open:
            return self._open_key if name == ANONYMOUS.name else None
        found = self._tokens.named(name)
        if found is None:
            return None
        return hashlib.sha256(_KEY_LABEL + found[1]).digest()

    def _principal(self, name: str) -> Principal | None:
        found = self._tokens.named(name)
        return found[0] if found else None


def set_session_cookie(
    response: Response, request: Request, signer: SessionSigner, session: Session
) -> None:
    """Attach ``session`` to ``response`` as the console's cookie (see the module doc)."""
    response.set_cookie(
        COOKIE_NAME,
        signer.encode(session),
        max_age=SESSION_SECONDS,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_session_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")


def mask_csrf_token(token: str) -> str:
    """``token`` as one answer carries it: a fresh random pad and the token XORed with
    that pad, base64url (twice the token's length in bytes). Every answer carries
    different text for the same token; ``csrf_matches`` unmasks it."""
    raw = token.encode("ascii")
    pad = secrets.token_bytes(len(raw))
    return _b64(pad + _xor(pad, raw))


def csrf_matches(session: Session, presented: str | None) -> bool:
    """True when ``presented`` is the session's CSRF token as ``mask_csrf_token`` masked
    it (constant-time compare); anything else, the unmasked token too, is False."""
    if not presented:
        return False
    try:
        raw = _unb64(presented)
    except ValueError:
        return False
    half, odd = divmod(len(raw), 2)
    if odd or not half:
        return False
    token = _xor(raw[:half], raw[half:])
    return hmac.compare_digest(session.csrf_token.encode("ascii"), token)


def _xor(pad: bytes, data: bytes) -> bytes:
    return bytes(p ^ d for p, d in zip(pad, data, strict=True))


def _mac(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
