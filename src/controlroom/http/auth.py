"""Who is calling: principals, their roles and the configured tokens.

Two kinds of caller, each from its own settings:

- an operator's token (``auth_tokens``: name, token, role) is a ``Principal``. Roles, each
  with the rights of the ones before it: ``reader``, ``operator``, ``admin``. The console
  signs a session for such a principal (``controlroom.web.session``);
- a site's token (``sites[].central_token``, what that site's agent presents to central)
  is a ``SitePrincipal``: it may post that site's telemetry and nothing else, and never
  signs in to the console (docs/design.md "Site credentials").

The API checks a request's bearer token against the table (``controlroom.api.auth``).

Tokens are compared with ``hmac.compare_digest`` against every configured token, so the
time taken says nothing about which token, or how much of one, matched. Tokens are never
logged or echoed; the caller is named by its token's ``name``.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from controlroom.config import AuthToken, ConfiguredSite, Role, Settings

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


@dataclass(frozen=True, slots=True)
class SitePrincipal:
    """A site's agent, by its site's token: it speaks for ``site`` (its ``source_site``)
    only, and has no role (no read, no operator action)."""

    site: str

    @property
    def name(self) -> str:
        """How logs and answers name it (``site:<id>``); never the token."""
        return f"site:{self.site}"


Caller = Principal | SitePrincipal
"""Anyone a configured token identifies."""


class TokenTable:
    """The configured tokens of both kinds, ready for constant-time lookup."""

    def __init__(self, tokens: Sequence[AuthToken], sites: Sequence[ConfiguredSite] = ()) -> None:
        self._operators = [
            (entry.token.get_secret_value().encode("utf-8"), Principal(entry.name, entry.role))
            for entry in tokens
        ]
        self._entries: list[tuple[bytes, Caller]] = [
            *self._operators,
            *(
                (site.central_token.get_secret_value().encode("utf-8"), SitePrincipal(site.id))
                for site in sites
                if site.central_token is not None
            ),
        ]

    @property
    def open(self) -> bool:
        """True when no operator token is configured: the operator API and the console
        do not authenticate (a site's token does not change that)."""
        return not self._operators

    @property
    def sites_open(self) -> bool:
        """True when no token of either kind is configured: anyone may post telemetry for
        any site (the loopback dev mode). Once any token exists, only a site's own token
        may."""
        return not self._entries

    def identify(self, presented: str) -> Caller | None:
        """The operator or site whose token is ``presented``, ``None`` for an unknown
        token.

        Compares against every entry of both kinds, in constant time each, and does not
        stop at a match, so the time taken does not depend on which entry matched.
        """
        candidate = presented.encode("utf-8")
        found = None
        for secret, caller in self._entries:
            if hmac.compare_digest(secret, candidate):
                found = caller
        return found

    def find(self, presented: str) -> Principal | None:
        """The operator principal whose token is ``presented``; ``None`` for an unknown
        token and for a site's token (which never signs in to the console)."""
        found = self.identify(presented)
        return found if isinstance(found, Principal) else None

    def named(self, name: str) -> tuple[Principal, bytes] | None:
        """The operator principal called ``name`` and its token (the console derives the
        key that signs that principal's session from it), ``None`` when no operator token
        has this name."""
        for secret, principal in self._operators:
            if principal.name == name:
                return principal, secret
        return None


def token_table(settings: Settings) -> TokenTable:
    """The token table of ``settings`` (``create_app`` keeps it on ``app.state.auth``)."""
    return TokenTable(settings.auth_tokens, settings.sites)
