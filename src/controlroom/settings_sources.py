"""Where settings come from, for central and the site agent alike: keyword arguments, then
the environment, then a TOML file named by the model's ``toml_file`` or an environment
variable (the environment wins over the file); the bearer secrets both configure; and
where a refused setting was given, for the commands' one-line refusals."""

from __future__ import annotations

import difflib
import ipaddress
import itertools
import json
import os
import re
import typing
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Annotated, ClassVar, TypedDict
from urllib.parse import unquote, urlsplit

import httpx
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationInfo,
    field_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError, PydanticKnownError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsError,
    TomlConfigSettingsSource,
)

from controlroom.runtime.addresses import bare_host
from controlroom.runtime.wire_text import check_site_id, is_label

CENTURY_DAYS = 36_500
"""The longest a duration setting may be: a stamp of now minus (or plus) a longer one can
leave the calendar (year 1 or 9999), and a timer or lease of one overflows, which the part
computing it would fail on at every run instead of at start."""


# A number of seconds as text: digits, a decimal point, an exponent (what float() reads,
# without its nan, inf and underscores).
_SECONDS_TEXT = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*", re.ASCII)
_WHOLE_DAYS_TEXT = re.compile(r"\s*[+-]?\d+\s*", re.ASCII)

_NUMBER = r"\d+(?:[.,]\d+)?"
_ISO_8601_DURATION = re.compile(
    rf"[-+]?P(?=\d|T\d)(?:{_NUMBER}Y)?(?:{_NUMBER}M)?(?:{_NUMBER}W)?(?:{_NUMBER}D)?"
    rf"(?:T(?=\d)(?:{_NUMBER}H)?(?:{_NUMBER}M)?(?:{_NUMBER}S)?)?",
    re.IGNORECASE | re.ASCII,
)
"""ISO 8601's duration: each part at most once, in order (pydantic's parser adds a repeated
part up: ``PT1H1H`` read as two hours)."""


def _iso_8601_text(value: object) -> str | None:
    """``value`` stripped and in upper case, as pydantic reads a duration, when it is text
    that means ISO 8601 (starts with ``P``, after a sign); else None."""
    if not isinstance(value, str):
        return None
    text = value.strip().upper()
    return text if text.lstrip("+-").startswith("P") else None


def _iso_8601_well_formed(value: object) -> object:
    """``value`` itself (an ISO 8601 duration in upper case, as pydantic reads it), unless
    it is a malformed ISO 8601 duration (raises pydantic's ``time_delta_parsing``)."""
    text = _iso_8601_text(value)
    if text is None:
        return value
    if not _ISO_8601_DURATION.fullmatch(text):
        # pydantic's own kind, so the refusal names a duration's forms (``how_to_give``).
        raise PydanticKnownError(
            "time_delta_parsing", {"error": "each part at most once, in ISO 8601's order"}
        )
    return text


def _iso_8601_in_seconds(value: object) -> object:
    """An ISO 8601 duration (``PT1H``) as its seconds; other text that is no number of
    seconds (``5m``) refused as no duration (pydantic's ``time_delta_parsing``, so the
    refusal names a duration's forms); anything else as it is."""
    text = _iso_8601_text(value)
    if text is not None:
        return _DURATION.validate_python(text).total_seconds()
    if isinstance(value, str) and not _SECONDS_TEXT.fullmatch(value):
        raise PydanticKnownError(
            "time_delta_parsing", {"error": "neither ISO 8601 nor a number of seconds"}
        )
    return value


DAYS_PARSING = "days_parsing"
"""The kind of error of a setting in days given as text that is no number of days."""


def _in_days(whole: bool) -> Callable[[object], object]:
    """The before-validator of a setting in days: an ISO 8601 duration (``P365D``, ``P1Y``)
    as its days (``whole``: only a whole number of them); other text that is no number
    refused (``DAYS_PARSING``); anything else as it is."""
    number = _WHOLE_DAYS_TEXT if whole else _SECONDS_TEXT

    def days(value: object) -> object:
        text = _iso_8601_text(value)
        if text is not None and _ISO_8601_DURATION.fullmatch(text):
            given = _DURATION.validate_python(text).total_seconds() / 86_400
            if not whole or given.is_integer():
                return int(given) if whole else given
        elif not isinstance(value, str) or number.fullmatch(value):
            return value
        raise PydanticCustomError(DAYS_PARSING, "it is no number of days")

    return days


_DURATION = TypeAdapter(timedelta)

# Before validators run last first: the form is checked, then read.
Seconds = Annotated[
    float,
    BeforeValidator(_iso_8601_in_seconds),
    BeforeValidator(_iso_8601_well_formed),
    Field(le=CENTURY_DAYS * 86_400),
]
"""A duration setting in seconds, given as a number or in ISO 8601 (``PT1H``): at most a
century."""

Period = Annotated[timedelta, Field(le=timedelta(days=CENTURY_DAYS))]
"""A duration setting as a ``timedelta`` (ISO 8601 or seconds): at most a century."""

Days = Annotated[float, BeforeValidator(_in_days(whole=False)), Field(le=CENTURY_DAYS)]
"""A duration setting in days, given as a number or in ISO 8601 (``P7D``): at most a
century."""

WholeDays = Annotated[int, BeforeValidator(_in_days(whole=True)), Field(le=CENTURY_DAYS)]
"""A duration setting in whole days, given as a number or in ISO 8601 of whole days
(``P365D``, ``P1Y``): at most a century."""

MIN_INTERVAL_SECONDS = 0.05
"""The shortest period of a loop that runs whether or not there is work (a report, a
dispatch, a purge): a microsecond kept serve busy doing them (80 % of a core)."""

MAX_COUNT = 1_000_000_000
"""The most an integer setting that counts (messages, attempts, pages) may be: beyond any
real count, and inside the stores' 64-bit integers, which a larger value passed to a
query overflowed (SQLite's at 2**63)."""

MAX_BYTES = 2**40
"""The most a size setting in bytes may be (1 TiB)."""

MAX_PREFETCH = 65_535
"""The most deliveries an intake holds unacknowledged: AMQP's ``basic.qos`` carries the
prefetch count as a 16-bit number (the embedded queue takes the same settings)."""

MAX_QUEUE_NAME_BYTES = 255
"""The longest queue name, in bytes (its characters are ASCII): RabbitMQ's limit, which
the embedded queue follows so that a name valid on one transport is valid on the other."""


def http_url_problem(url: str, *, credentials: bool = True, base: bool = False) -> str | None:
    """Why ``url`` is no address an HTTP client can use, in a sentence that never quotes
    it (it may hold a password), or ``None``: it must be ``http://`` or ``https://`` with a
    host (an IP address, or a name of letters, digits, hyphens and underscores in
    dot-separated labels, none empty or with a hyphen at an end: names a resolver takes)
    and, if given, a port from 1 to 65535, that httpx (the client every sender uses)
    takes as it is (an IPv4 address past 255, a host that is no IDNA name); with
    ``credentials`` false, no ``user:password@`` either (one shown to readers); with
    ``base``, no query or fragment (paths are appended to it)."""
    if any(character.isspace() or not character.isprintable() for character in url):
        return "it must be a URL without white space or control characters"
    usable = "it must be an http:// or https:// URL with a host and a port from 1 to 65535"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises past 65535 or when no number
        parsed = httpx.URL(url)
        parsed.host  # noqa: B018 - decodes an xn-- label, which may raise
        host = parsed.raw_host.decode("ascii")  # IDNA-encoded: the labels a resolver gets
    except (ValueError, httpx.InvalidURL):  # the port, an unclosed [, the host
        return usable
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or port == 0:
        return usable
    if not is_ip_address(host) and not _URL_HOST.fullmatch(host):
        return usable
    if not credentials and (parts.username is not None or parts.password is not None):
        return "it must hold no user or password (the credentials are its token)"
    if base and (parts.query or parts.fragment or url.endswith(("?", "#"))):
        return "it must hold no query or fragment (paths are added after it)"
    if base and not unquote(parts.path).isprintable():
        return "its path must hold no escaped control character (%00, %0A: every path has it)"
    return None


_URL_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_URL_HOST = re.compile(rf"{_URL_LABEL}(?:\.{_URL_LABEL})*\.?")
"""A host name in a URL: RFC 1123 labels, underscores admitted (resolvers take them, and
a Docker Compose service may be named so)."""


PORT_PROBLEM = "its port must be a number from 1 to 65535"
"""The refusal of a URL's port that is no TCP port (0 included: libpq and others take it
for their default)."""


def expand_home(path: Path) -> Path:
    """``path`` with a leading ``~`` or ``~user`` read as a shell reads it; raises
    ``ValueError`` when that home cannot be found."""
    try:
        return path.expanduser()
    except RuntimeError:  # pathlib: "Could not determine home directory."
        raise ValueError(f"no home directory is known for {path.parts[0]}") from None


def is_host(host: str) -> bool:
    """``host`` is an IP address, or a host name (IDNA-encoded when not ASCII) of the
    labels ``http_url_problem`` takes; digits and dots alone are an IPv4 address or no
    host."""
    if is_ip_address(host):
        return True
    if all(label.isdigit() for label in host.rstrip(".").split(".")):
        return False  # an IPv4 address out of range (999.1.1.1), or a legacy form (1.2.3)
    try:
        encoded = host.encode("idna").decode("ascii")
    except UnicodeError:
        return False
    return _URL_HOST.fullmatch(encoded) is not None


def is_ip_address(host: str) -> bool:
    """``host`` is an IPv4 or IPv6 address (without brackets)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


SECRET_LENGTH = 16
"""The fewest characters of a bearer token central or an agent is configured with."""


def _long_enough(value: object) -> object:
    """Refuses a secret shorter than ``SECRET_LENGTH`` as pydantic refuses any short string
    ("at least 16 characters"): a length constraint on ``SecretStr`` itself is checked
    after validation, as a collection's ("at least 16 items")."""
    secret = value.get_secret_value() if isinstance(value, SecretStr) else value
    if secret == "":
        raise PydanticCustomError(
            "secret_empty", f"it is empty: unset it, or give at least {SECRET_LENGTH} characters"
        )
    if isinstance(secret, str) and len(secret) < SECRET_LENGTH:
        raise PydanticKnownError("string_too_short", {"min_length": SECRET_LENGTH})
    return value


def _header_safe(value: object) -> object:
    """Refuses a secret an ``Authorization: Bearer`` header could not carry as it is: a
    space, a control character or a character outside ASCII (HTTP sends header values as
    Latin-1 bytes, and a space ends the token)."""
    secret = value.get_secret_value() if isinstance(value, SecretStr) else value
    if isinstance(secret, str) and not all("!" <= character <= "~" for character in secret):
        raise PydanticCustomError(
            "token_not_visible_ascii",
            "a token is visible ASCII only: no space, line break or other character",
        )
    return value


BearerSecret = Annotated[SecretStr, BeforeValidator(_header_safe), BeforeValidator(_long_enough)]
"""A bearer token: a ``SecretStr`` of at least ``SECRET_LENGTH`` characters of visible
ASCII."""


def one_secret_per_direction(token: SecretStr | None, central_token: SecretStr | None) -> None:
    """Raises ``ValueError`` when a site's two secrets are one: whoever reads central's
    pulls could then post as the site, and whoever reads the site's posts pull and relay to
    it (central's ``sites`` entry and the agent check it alike)."""
    if (
        token is not None
        and central_token is not None
        and token.get_secret_value() == central_token.get_secret_value()
    ):
        raise ValueError("token and central_token must differ (one secret per direction)")


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")
"""A DNS name as a resolver takes it (RFC 1123 labels: letters, digits, inner hyphens)."""


def check_listen_host(host: str) -> str:
    """A host ``serve`` or an agent listens on: an IP address or a DNS name, so that a
    wrong one is refused at start naming the setting, not by the socket's resolver."""
    bare = bare_host(host)  # [::1]
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        if not _HOST_NAME.fullmatch(host):
            raise ValueError(
                "it must be a host name or an IP address to listen on (127.0.0.1, 0.0.0.0, "
                "::, localhost), without scheme or port"
            ) from None
    return host


SiteId = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(check_site_id)]
"""A site's id (central's ``sites[].id``, the agent's ``site_id``): 1 to 64 printable
characters, not blank, no space at either end."""

def check_node_name(node: str) -> str:
    """``node`` itself when it may name a site's node (its calls' ``source_node``, a label
    in the KPIs per node); raises ``ValueError`` otherwise, by a site id's rule
    (``runtime.wire_text.is_label``): " node-1" would be another node than "node-1"."""
    if not is_label(node):
        raise ValueError(
            "a node's name is printable text, neither blank nor beginning or ending with space"
        )
    return node


NodeName = Annotated[str, Field(max_length=64), AfterValidator(check_node_name)]
"""A site agent's node (``node``): up to 64 printable characters, not blank, no space at
either end."""

ListenHost = Annotated[str, AfterValidator(check_listen_host)]
"""A host ``serve`` or an agent listens on (``check_listen_host``)."""


def _wants_a_number(model: type[BaseModel], field_name: str | None) -> bool:
    """Whether the field takes a number (or a duration) and no boolean."""
    field = model.model_fields.get(field_name or "")
    if field is None:
        return False
    kinds = (field.annotation, *typing.get_args(field.annotation))
    return bool not in kinds and any(kind in (int, float, timedelta) for kind in kinds)


def _wants_a_duration(model: type[BaseModel], field_name: str | None) -> bool:
    """Whether the field takes a ``timedelta``."""
    field = model.model_fields.get(field_name or "")
    return field is not None and timedelta in (field.annotation, *typing.get_args(field.annotation))




def _numbers_as_numbers(model: type[BaseModel], value: object, info: ValidationInfo) -> object:
    """Refuses a TOML or JSON ``true``/``false`` given for a number: pydantic's lax mode
    reads it as 1 or 0 (a one-second duration, a batch of one), which nobody means. Reads
    a duration given as a number of seconds in text (an environment variable, a JSON or
    TOML string: ``"3600"``) as that number, which pydantic reads only when it is no text
    (README "Configuration": a duration is ISO 8601 or a number of seconds), and refuses
    a malformed ISO 8601 one (``_iso_8601_well_formed``)."""
    if isinstance(value, bool) and _wants_a_number(model, info.field_name):
        raise PydanticCustomError("number_not_boolean", "a number is wanted, not true or false")
    if isinstance(value, str) and _wants_a_duration(model, info.field_name):
        value = value.strip()  # as a duration in seconds is read
        if _SECONDS_TEXT.fullmatch(value):
            return float(value)
        return _iso_8601_well_formed(value)
    return value


class SettingsTable(BaseModel):
    """A table of settings (``[ingestion]``, an item of ``[[sites]]``, ...): a name that is
    no setting is refused, as are ``nan``, ``inf`` and ``true``/``false`` for a number."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: object, info: ValidationInfo) -> object:
        return _numbers_as_numbers(cls, value, info)


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

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: object, info: ValidationInfo) -> object:
        return _numbers_as_numbers(cls, value, info)

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


def given_in(
    loc: tuple[int | str, ...], prefix: str, config: Path | None, *, given: bool = False
) -> str | None:
    """The setting at ``loc`` as the user gave it: the environment variable set that holds
    it, then the item and field inside that variable's JSON (``CONTROLROOM_SITES, item 0,
    field base_url``: no variable names a list's item); a table's own check names every
    variable set under it, as spelled; else the variable that would hold it, or the
    settings file, when one was read. ``given``: the name at ``loc`` was given (a name
    that is no setting), so when no variable holds it the file does. ``None`` for a check
    across the settings (``loc`` empty), whose message names the settings it compares."""
    if not loc:
        return None
    names = list(itertools.takewhile(lambda part: isinstance(part, str), loc))
    environ = {name.upper(): name for name in os.environ}
    table = prefix + "__".join(map(str, names)).upper()
    made_of = sorted(
        (name for upper, name in environ.items() if _under(upper, table)), key=str.upper
    )
    if len(names) == len(loc) and any(name.upper() != table for name in made_of):
        # The table is merged from these variables and from the file's table of its name.
        return " and ".join(made_of) + (f" or in {config}" if config else "")
    for depth in range(len(names), 0, -1):
        variable = environ.get(prefix + "__".join(map(str, names[:depth])).upper())
        if variable is None:
            continue
        reached, found = _json_at(os.environ[variable], loc[depth:])
        if reached and given and config is not None and isinstance(found, _Absent):
            return f"in {config}"
        if reached:
            # A table given as JSON is merged with the file's table of the same name: a
            # name the JSON lacks may be the file's.
            merged = isinstance(found, dict | _Absent) and config is not None
            return _inside(variable, loc[depth:]) + (f" or in {config}" if merged else "")
    if given and config is not None:
        return f"in {config}"
    return _inside(table, loc[len(names) :]) + (f" or in {config}" if config else "")


def how_to_give(loc: tuple[int | str, ...], kind: str, prefix: str) -> str | None:
    """How to give the setting at ``loc`` refused with pydantic's error ``kind``: a
    duration's forms; a list refused as no list because variables set its items
    (``CONTROLROOM_SITES__0__BASE_URL``): no variable sets a list's item, the list is
    given whole as JSON; else ``None``."""
    if kind == DAYS_PARSING:
        return "a number of days (365) or ISO 8601 in whole days (P365D, P1Y, P2W)"
    if kind in ("time_delta_parsing", "time_delta_type"):
        return (
            "a duration is ISO 8601 (P30D, PT12H, P1DT6H: each part at most once, in that "
            "order) or a positive number of seconds (3600)"
        )
    if kind != "list_type" or not all(isinstance(part, str) for part in loc):
        return None
    variable = prefix + "__".join(map(str, loc)).upper()
    if any(name.upper().startswith(variable + "__") for name in os.environ):
        return f"a list setting is given whole as JSON in {variable}"
    return None


def no_such_setting(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """Why the name at ``loc`` is refused (pydantic's ``extra_forbidden``): it names no
    setting of ``model`` there, and the closest name of that table when one is close (a
    misspelling: ``batch_siz`` -> ``batch_size``), else the table's setting it names
    (``batch_size`` at the top -> ``ingestion.batch_size``)."""
    close = closest_setting(model, loc)
    return "no such setting" + (f"; did you mean {close}?" if close else "")


def closest_setting(model: type[BaseModel], loc: tuple[int | str, ...]) -> str | None:
    """The setting the unknown name at ``loc`` most likely meant (``no_such_setting``):
    a close name of its table, else a table's setting of that name; ``None``."""
    table: object = model
    for part in loc[:-1]:
        table = _field_model(table, part)
    names = list(table.model_fields) if _is_model(table) else []
    close = difflib.get_close_matches(str(loc[-1]).lower(), names, n=1)
    if close:
        return close[0]
    if _is_model(table) and (nested := _in_a_table(table, str(loc[-1]).lower())):
        return ".".join(nested)  # a table's setting given outside its table
    return None


def misspelt_required(
    model: type[BaseModel], errors: list[ErrorDetails]
) -> set[tuple[int | str, ...]]:
    """The places of required settings reported missing only because a misspelling of
    them was given beside them (``smtp.hots`` for ``smtp.host``): the misspelling's
    refusal already says "did you mean host?", and "Field required" would be a second,
    misleading line."""
    meant = set()
    for error in errors:
        if error["type"] == "extra_forbidden":
            close = closest_setting(model, error["loc"])
            if close is not None and "." not in close:
                meant.add((*error["loc"][:-1], close))
    return meant


NOT_SETTINGS = (
    "CONFIG",
    "DEMO_QUIET_LOGS",
    "REQUIRE_SERVERS",
    "UPDATE_SCREENSHOTS",
    "TEST_",
    "BENCH_",
)
"""Variables under a prefix that are read as they are, not as settings: the settings
file's name (``CONTROLROOM_CONFIG``), the demo's quiet logs, the tests' and benchmarks'
servers, the tests' screenshots."""


def unknown_variables(
    model: type[BaseModel], prefix: str, *, besides: tuple[str, ...] = ()
) -> tuple[list[str], list[str]]:
    """The environment variables under ``prefix`` that pydantic-settings would ignore, as
    (warnings, refusals), one sentence each, naming the variable meant when one is close.

    A warning: a variable whose name names no setting (``CONTROLROOM_PROT names no
    setting and is ignored; did you mean CONTROLROOM_PORT?``): another program may share
    the prefix. A refusal: a nested variable (``__``) whose first part is no table
    (``CONTROLROOM_INGESTOIN__BATCH_SIZE``, ``CONTROLROOM_PORT__X``): it can only be a
    setting of this program, mistyped, as a file's unknown table is refused. Leaves out
    ``NOT_SETTINGS`` and names starting with one of ``besides`` after the prefix (another
    model's prefix sharing this one). A nested variable of a known table is checked by
    the model itself."""
    warnings, refusals = [], []
    names = list(model.model_fields)
    for variable in sorted(os.environ):
        upper = variable.upper()
        if not upper.startswith(prefix):
            continue
        rest = upper[len(prefix) :]
        if rest.startswith(NOT_SETTINGS + besides):
            continue
        first, nested, tail = rest.partition("__")
        first = first.lower()
        if nested:
            if first not in names:
                refusals.append(
                    f"{variable} is refused: no settings table is named {first.upper()}"
                    + _meant_hint(model, prefix, first, tail)
                )
            elif _is_single(model, first):
                refusals.append(
                    f"{variable} is refused: {prefix}{first.upper()} is one setting, not a table"
                )
            continue
        if first in names:
            continue
        meant = _in_a_table(model, rest.lower()) or difflib.get_close_matches(first, names, n=1)
        hint = f"; did you mean {prefix}{'__'.join(meant).upper()}?" if meant else ""
        warnings.append(f"{variable} names no setting and is ignored{hint}")
    return warnings, refusals


def _meant_hint(model: type[BaseModel], prefix: str, first: str, tail: str) -> str:
    """``"; did you mean VARIABLE?"`` for a nested variable whose table ``first`` is no
    table of ``model``: the setting its parts name joined by one underscore
    (``OUTBOX__BATCH`` for ``OUTBOX_BATCH``), else the closest table with the same field
    (``INGESTOIN__BATCH_SIZE`` for ``INGESTION__BATCH_SIZE``); empty when neither is."""
    joined = f"{first}_{tail.lower()}"
    if joined in model.model_fields:
        return f"; did you mean {prefix}{joined.upper()}?"
    tables = [name for name in model.model_fields if _is_model(_field_model(model, name))]
    close = difflib.get_close_matches(first, tables, n=1)
    return f"; did you mean {prefix}{close[0].upper()}__{tail}?" if close else ""


def _in_a_table(model: type[BaseModel], name: str) -> list[str]:
    """The table and field ``name`` means when it names one of ``model``'s tables' fields
    alone (``stop_grace_seconds``) or joined to the table by one underscore
    (``ingestion_batch_size``, a ``__`` meant), or is a close misspelling of either
    (``batch_siz``); else empty."""
    meant: dict[str, list[str]] = {}
    for table_name in model.model_fields:
        table = _field_model(model, table_name)
        if not _is_model(table) or table is model:
            continue
        for field in table.model_fields:
            meant.setdefault(field, [table_name, field])
            meant.setdefault(f"{table_name}_{field}", [table_name, field])
    close = difflib.get_close_matches(name, meant, n=1, cutoff=0.8)
    return meant.get(name) or (meant[close[0]] if close else [])


def _field_model(table: object, part: int | str) -> object:
    """The model of the table, or of the list's item, reached by ``part`` from ``table``."""
    if isinstance(part, int):
        return table  # the list's field already gave its items' model
    if not _is_model(table) or part not in table.model_fields:
        return None
    annotation = table.model_fields[part].annotation
    if _is_model(annotation):
        return annotation
    # A list of tables (``list[ConfiguredSite]``): its items' model.
    return next((arg for arg in typing.get_args(annotation) if _is_model(arg)), None)


def _is_single(model: type[BaseModel], name: str) -> bool:
    """Whether ``model``'s setting ``name`` is neither a table nor a list (whose items a
    nested variable may name, refused by the model itself)."""
    annotation = model.model_fields[name].annotation
    return _field_model(model, name) is None and typing.get_origin(annotation) is not list


def _is_model(value: object) -> typing.TypeGuard[type[BaseModel]]:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _under(variable: str, table: str) -> bool:
    """Whether ``variable`` (upper case) sets ``table`` or a field nested in it."""
    return variable == table or variable.startswith(table + "__")


class _Absent:
    """What a variable's JSON holds at a field its table lacks."""


def _json_at(value: str, place: tuple[int | str, ...]) -> tuple[bool, object]:
    """Whether ``value`` (a variable's JSON) holds ``place`` (or the item or table that
    lacks its last field), and what it holds there (an ``_Absent`` for that field)."""
    try:
        found: object = json.loads(value)
    except ValueError:
        return not place, value
    for index, part in enumerate(place):
        if isinstance(found, dict) and isinstance(part, str):
            if part not in found:
                return index == len(place) - 1, _Absent()
            found = found[part]
        elif isinstance(found, list) and isinstance(part, int) and 0 <= part < len(found):
            found = found[part]
        else:
            return False, None
    return True, found


def _inside(variable: str, place: tuple[int | str, ...]) -> str:
    """``variable`` then each item and field of ``place`` inside its value."""
    steps = [f"item {part}" if isinstance(part, int) else f"field {part}" for part in place]
    return ", ".join([variable, *steps])


def unparsed_variable(exc: SettingsError, prefix: str) -> str | None:
    """The environment variable (``prefix``-named) whose value, which must be JSON (a list
    or a table given whole), did not parse into ``exc``'s field; ``None`` when ``exc`` is
    not that. pydantic-settings names the top-level field in its message, not the
    variable: a change of that wording gives ``None`` (the generic refusal), never a
    crash."""
    cause = exc.__cause__
    field = re.search(r'field "([^"]+)"', str(exc))
    if not isinstance(cause, json.JSONDecodeError) or field is None:
        return None
    top = (prefix + field[1]).upper()
    return next(
        (
            name
            for name, value in os.environ.items()
            if value == cause.doc and _under(name.upper(), top)
        ),
        top,
    )
