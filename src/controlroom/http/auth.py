"""Who is calling: principals, their roles and the configured tokens.

Tokens come from the settings (``auth_tokens``: name, token, role). Roles, each with the
rights of the ones before it: ``reader``, ``operator``, ``admin``. The API checks a
request's bearer token against the table (``controlroom.api.auth``); the console signs a
session for a token's principal (``controlroom.web.session``).

Tokens are compared with ``hmac.compare_digest`` against every configured token, so the
time taken says nothing about which token, or how much of one, matched. Tokens are never
logged or echoed; the caller is named by its token's ``name``.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from controlroom.config import AuthToken, Role, Settings

ROLE_RANK: Final[dict[Role, int]] = {"reader": 0, "operator": 1, "admin": 2}


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the configured token's name and role."""

    name: str
    role: Role

    def may(self, role: Role) -> bool:
        """True when this principal has at least the rights of ``role``."""
        return ROLE_RANK[self.role] >= ROLE_RANK[role]


ANONYMOUS: Final = Principal(name="anonymous", role="admin")
"""The caller of an open API (no token configured): everything is allowed."""


class TokenTable:
    """The configured tokens, ready for constant-time lookup."""

    def __init__(self, tokens: Sequence[AuthToken]) -> None:
        self._entries = [
            (entry.token.get_secret_value().encode("utf-8"), Principal(entry.name, entry.role))
            for entry in tokens
        ]

    @property
    def open(self) -> bool:
        """True when no token is configured: the API does not authenticate."""
        return not self._entries

    def find(self, presented: str) -> Principal | None:
        """The principal whose token is ``presented``, ``None`` for an unknown token.

        Compares against every entry, in constant time each, and does not stop at a
        match, so the time taken does not depend on which entry matched.
        """
        candidate = presented.encode("utf-8")
        found = None
        for secret, principal in self._entries:
            if hmac.compare_digest(secret, candidate):
                found = principal
        return found

    def named(self, name: str) -> tuple[Principal, bytes] | None:
        """The principal called ``name`` and its token (the console derives the key that
        signs that principal's session from it), ``None`` when no token has this name."""
        for secret, principal in self._entries:
            if principal.name == name:
                return principal, secret
        return None


def token_table(settings: Settings) -> TokenTable:
    """The token table of ``settings`` (``create_app`` keeps it on ``app.state.auth``)."""
    return TokenTable(settings.auth_tokens)
