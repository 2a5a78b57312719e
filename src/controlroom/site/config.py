"""Settings of a site agent: environment (``CONTROLROOM_SITE_*``, nested with ``__``), an
optional TOML file, defaults. Separate from central's ``controlroom.config``: a site
process configures only its agent."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar, Unpack
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    SettingsConfigDict,
)

from controlroom.settings_sources import (
    BearerSecret,
    Days,
    EnvThenTomlSettings,
    ListenHost,
    ListenOverrides,
    NodeName,
    Seconds,
    SiteId,
    expand_home,
    http_url_problem,
    one_secret_per_direction,
)


def central_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be central's root as an agent posts to it, in a sentence that
    never quotes it, or ``None``: no HTTP URL (``http_url_problem``), credentials, a query
    or fragment, or a path ending in ``/api`` (the agent adds ``/api/...`` itself)."""
    problem = http_url_problem(url, credentials=False, base=True)
    if problem is None and urlsplit(url).path.rstrip("/").endswith("/api"):
        problem = "it must be central's root, without /api (the agent adds /api/... itself)"
    return problem


class SiteSettings(EnvThenTomlSettings):
    """Everything a site agent can be told. Durations are seconds."""

    config_file_variable: ClassVar[str] = "CONTROLROOM_SITE_CONFIG"

    model_config = SettingsConfigDict(
        env_prefix="CONTROLROOM_SITE_",
        env_nested_delimiter="__",
        extra="forbid",
        hide_input_in_errors=True,
        allow_inf_nan=False,  # a "nan" or "inf" duration is refused as no number
    )

    site_id: SiteId = Field(description="source_site of its calls.")
    node: NodeName | None = Field(None, description="source_node of its calls.")
    store_path: Path = Field(
        Path("./controlroom-site/tracking.db"), description="The tracking store (SQLite)."
    )
    host: ListenHost = "127.0.0.1"
    port: int = Field(8090, ge=0, le=65535)
    token: BearerSecret | None = Field(
        None,
        description="Bearer token central presents to pull and to relay commands. None: "
        "the agent's HTTP API is open, which it allows on a loopback address only.",
    )
    central_url: str = Field(
        "", description="Central's base URL (http://host:8080); empty: telemetry stays queued."
    )
    central_token: BearerSecret | None = Field(
        None,
        description="Bearer token the agent posts its telemetry to central with: this "
        "site's central_token in central's sites (an operator's token is refused).",
    )
    max_retries: int = Field(5, ge=1, le=10_000, description="Transient failures before Parked.")
    backoff_base: Seconds = Field(1.0, gt=0, description="Wait after the first failure (s).")
    backoff_cap: Seconds = Field(300.0, gt=0, description="Longest wait between attempts (s).")
    attempt_timeout: Seconds = Field(30.0, gt=0, description="HTTP timeout of one attempt (s).")
    retry_poll: Seconds = Field(1.0, gt=0, description="Longest sleep of the retry loop (s).")
    outbox_batch: int = Field(100, ge=1, le=1000, description="Packets per POST to central.")
    outbox_poll: Seconds = Field(1.0, gt=0, description="Sleep of an empty outbox (s).")
    outbox_backoff_cap: Seconds = Field(
        30.0, gt=0, description="Longest wait between deliveries while central is down (s)."
    )
    notification_retention_days: Days = Field(
        7.0,
        gt=0,
        description="Days a notification central settled (Forwarded, or Rejected with its "
        "reason) stays in the store before it is purged; Pending ones are never purged.",
    )
    notification_purge_interval: Seconds = Field(
        3600.0, gt=0, description="Time between two purges of settled notifications (s)."
    )

    @field_validator("store_path", mode="before")
    @classmethod
    def _store_file(cls, value: object) -> object:
        """An empty path would be the current directory (``Path("")``), and a directory
        (one that exists, or any path ending in a slash) is no database file, nor is a
        path through a file: refused naming the setting, not by the store's first use. A
        leading ``~`` is the user's home, as a shell reads it."""
        if isinstance(value, str) and not value.strip():
            raise ValueError("it is empty: unset it for the default, or name a file")
        if not isinstance(value, str | Path):
            return value
        path = expand_home(Path(value))
        if str(value).endswith(("/", os.sep)) or path.is_dir():
            raise ValueError("it names a directory: name a file in it")
        if path.exists() and not path.is_file():
            raise ValueError("it names a device or another special file: name a file")
        on_the_way = next((p for p in path.parents if p.exists()), None)
        if on_the_way is not None and not on_the_way.is_dir():
            raise ValueError(f"{on_the_way} is a file, not a directory: name a file elsewhere")
        return path

    @field_validator("central_url")
    @classmethod
    def _central_url(cls, url: str) -> str:
        """Refused at start, not failing at every delivery for ever: no HTTP URL, one with
        ``user:password@`` (the credentials are ``central_token``; the URL is logged), one
        with a query or fragment, or one ending in ``/api`` (the agent adds central's
        ``/api/...`` paths itself)."""
        problem = central_url_problem(url) if url else None
        if problem:
            raise ValueError(problem)
        return url

    @model_validator(mode="after")
    def _backoff_grows(self) -> SiteSettings:
        """Waits double from ``backoff_base`` up to ``backoff_cap``: a cap below the base
        would make every wait the cap."""
        if self.backoff_cap < self.backoff_base:
            raise ValueError(
                f"backoff_cap ({self.backoff_cap:g} s) is below backoff_base "
                f"({self.backoff_base:g} s): waits grow from the base up to the cap"
            )
        return self

    @model_validator(mode="after")
    def _one_secret_per_direction(self) -> SiteSettings:
        one_secret_per_direction(self.token, self.central_token)
        return self


def load_site_settings(
    config_file: Path | None = None, **overrides: Unpack[ListenOverrides]
) -> SiteSettings:
    """The agent's settings, reading ``config_file`` (TOML) when given. Raises
    ``pydantic.ValidationError`` naming the offending setting."""
    if config_file is None:
        return SiteSettings(**overrides)

    class FileSettings(SiteSettings):
        model_config = SettingsConfigDict(**{**SiteSettings.model_config, "toml_file": config_file})

    return FileSettings(**overrides)
