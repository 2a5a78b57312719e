"""A secret shorter than its setting's least length is refused in characters, as any
string setting is: the length check must be the string's, not the generic one pydantic
applies after validating a type it does not know ("at least 16 items")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from controlroom.config import AuthToken, ConfiguredSite
from controlroom.site.config import SiteSettings

LONG = "s3cret-of-16-chr"
SITE = {"id": "north", "base_url": "http://north:8090"}


def auth_token(token: object) -> object:
    return AuthToken(name="a", token=token, role="reader")  # type: ignore[arg-type]


def site_token(token: object) -> object:
    return ConfiguredSite(**SITE, token=token)  # type: ignore[arg-type]


def site_central_token(token: object) -> object:
    return ConfiguredSite(**SITE, central_token=token)  # type: ignore[arg-type]


def agent_token(token: object) -> object:
    return SiteSettings(site_id="north", token=token)  # type: ignore[arg-type]


SECRETS: list[Callable[[object], Any]] = [
    auth_token,
    site_token,
    site_central_token,
    agent_token,
]


@pytest.mark.parametrize("make", SECRETS)
@pytest.mark.parametrize("short", ["short", SecretStr("short")])
def test_a_short_secret_is_refused_in_characters(
    make: Callable[[object], Any], short: object
) -> None:
    with pytest.raises(ValidationError) as refused:
        make(short)
    [error] = refused.value.errors()
    assert error["type"] == "string_too_short", error
    assert error["msg"] == "String should have at least 16 characters", error


@pytest.mark.parametrize("make", SECRETS)
@pytest.mark.parametrize("given", [LONG, SecretStr(LONG)])
def test_a_secret_of_the_least_length_is_a_secret_str(
    make: Callable[[object], Any], given: object
) -> None:
    made = make(given)
    secret = next(value for value in vars(made).values() if isinstance(value, SecretStr))
    assert secret.get_secret_value() == LONG


@pytest.mark.parametrize("make", SECRETS)
def test_an_empty_secret_is_refused_saying_to_unset_it(make: Callable[[object], Any]) -> None:
    """Fresh-user pass (sixth): ``CONTROLROOM_SITE_TOKEN=`` said "at least 16 characters",
    where the README says to unset it."""
    with pytest.raises(ValidationError) as refused:
        make("")
    [error] = refused.value.errors()
    assert error["msg"] == "it is empty: unset it, or give at least 16 characters", error
