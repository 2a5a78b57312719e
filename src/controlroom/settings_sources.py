"""Where settings come from, for central and the site agent alike: keyword arguments, then
the environment, then a TOML file named by the model's ``toml_file`` or an environment
variable (the environment wins over the file)."""

from __future__ import annotations

import os
from typing import ClassVar, TypedDict

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, TomlConfigSettingsSource


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
