"""Where settings come from, for central and the site agent alike: keyword arguments, then
the environment, then a TOML file named by the model's ``toml_file`` or an environment
variable (the environment wins over the file); and the bearer secrets both configure."""

from __future__ import annotations

import os
from typing import Annotated, ClassVar, TypedDict

from pydantic import BeforeValidator, SecretStr
from pydantic_core import PydanticKnownError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, TomlConfigSettingsSource

SECRET_LENGTH = 16
"""The fewest characters of a bearer token central or an agent is configured with."""


def _long_enough(value: object) -> object:
    """Refuses a secret shorter than ``SECRET_LENGTH`` as pydantic refuses any short string
    ("at least 16 characters"): a length constraint on ``SecretStr`` itself is checked
    after validation, as a collection's ("at least 16 items")."""
    secret = value.get_secret_value() if isinstance(value, SecretStr) else value
    if isinstance(secret, str) and len(secret) < SECRET_LENGTH:
        raise PydanticKnownError("string_too_short", {"min_length": SECRET_LENGTH})
    return value


BearerSecret = Annotated[SecretStr, BeforeValidator(_long_enough)]
"""A bearer token: a ``SecretStr`` of at least ``SECRET_LENGTH`` characters."""


class ListenOverrides(TypedDict, total=False):
    """Settings the command line may give over every other source: where to listen."""

    host: str
    port: int


class EnvThenTomlSettings(BaseSettings):
    """Settings read from init arguments, the environment, then a TOML file.

    ``config_file_variable`` names the environment variable that may hold the TOML file's
    path when the model's ``toml_file`` is not set (``--config`` sets it).
    """

    config_file_variable: ClassVar[str]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml_file = settings_cls.model_config.get("toml_file") or os.environ.get(
            cls.config_file_variable
        )
        if toml_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)
