"""The telemetry contract: what a site sends about one cached call, validated whole.

Source: docs/design.md "site_calls" (the telemetry contract). A packet is a JSON
object (example in README "Site call telemetry"). Every text value is bounded by the width
of the column it lands in (characters, ``controlroom.telemetry.widths``, which central's
tables and the site's store are declared with, so none can drift); a longer value rejects
the packet — never truncated (docs/decisions.md "Telemetry is refused, never truncated").
Times are ISO 8601 text with a zone, kept in UTC, so they must stay within years 1-9999
once converted; a site's stamps are kept to 100 ns exactly as sent (``telemetry.stamps``:
more than seven fractional digits are refused, naming the field); integers and booleans
are taken as sent (strict, never coerced from text).
Unknown fields are refused by name, so nothing a site sends is dropped silently. The
site agent checks what it will report with the same rules (``check_target``,
``check_actor``). Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails

from controlroom.exceptions import ControlroomError
from controlroom.runtime.wire_text import check_site_id, storable_text
from controlroom.telemetry.json_arrays import json_value
from controlroom.telemetry.ordering import TERMINAL, Channel, SiteCallStatus
from controlroom.telemetry.stamps import Stamp
from controlroom.telemetry.widths import (
    ACTION_WIDTH,
    ACTOR_WIDTH,
    CATEGORY_WIDTH,
    LAST_ERROR_WIDTH,
    NODE_WIDTH,
    SITE_WIDTH,
    TARGET_WIDTH,
)

Contract = TypeVar("Contract", bound=BaseModel)

_GUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


class TelemetryRejected(ControlroomError):
    """A packet breaks the contract; ``reason`` names the field(s) at fault."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def storable(value: str) -> str:
    """Refuse what no provider stores as text: NUL and unpaired surrogates."""
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (an unpaired surrogate)") from None
    return value


def _guid(value: str) -> str:
    if not _GUID.fullmatch(value):
        raise ValueError("must be a GUID in 'D' format (8-4-4-4-12 hex digits)")
    return value.lower()


Guid = Annotated[str, AfterValidator(_guid)]
# JSON integers and booleans as sent: no "7" for 7, no true for 1, no 2.0 for 2.
Integer = Annotated[int, Strict()]
StorableText = Annotated[str, AfterValidator(storable)]
# The rules of the values a site agent takes from its callers and later reports (a call's
# target, an operator as an audit actor): the agent refuses what central would.
CallTarget = Annotated[str, Field(min_length=1, max_length=TARGET_WIDTH), AfterValidator(storable)]
AuditActor = Annotated[str, Field(min_length=1, max_length=ACTOR_WIDTH), AfterValidator(storable)]
_Action = Annotated[str, Field(min_length=1, max_length=ACTION_WIDTH), AfterValidator(storable)]
_Category = Annotated[str, Field(min_length=1, max_length=CATEGORY_WIDTH), AfterValidator(storable)]
SiteName = Annotated[
    str,
    Field(min_length=1, max_length=SITE_WIDTH),
    AfterValidator(storable),
    AfterValidator(check_site_id),
]
"""A site's id as a packet or a notification names it (``source_site``): as a configured
site's id may be (``runtime.wire_text.check_site_id``)."""
_Target = Annotated[str, Field(min_length=0, max_length=TARGET_WIDTH), AfterValidator(storable)]
_Node = Annotated[str, Field(min_length=0, max_length=NODE_WIDTH), AfterValidator(storable)]
_LastError = Annotated[
    str, Field(min_length=0, max_length=LAST_ERROR_WIDTH), AfterValidator(storable)
]
_TARGET_RULE: TypeAdapter[str] = TypeAdapter(CallTarget)
_ACTOR_RULE: TypeAdapter[str] = TypeAdapter(AuditActor)


def _checked(rule: TypeAdapter[str], field: str, value: str) -> str:
    try:
        return rule.validate_python(value)
    except ValidationError as error:
        problems = "; ".join(item["msg"] for item in error.errors(include_url=False))
        raise ValueError(f"{field}: {problems}") from None


def check_target(value: str) -> str:
    """``value`` if central takes it as a call's ``target``. Raises ``ValueError`` naming
    ``target`` (empty, longer than the column, a NUL or an unpaired surrogate)."""
    return _checked(_TARGET_RULE, "target", value)


def check_actor(value: str, field: str = "actor") -> str:
    """``value`` if central takes it as an audit event's actor. Raises ``ValueError``
    naming ``field``."""
    return _checked(_ACTOR_RULE, field, value)


def _json_text(value: str | None) -> str | None:
    if value is not None:
        storable(value)
        try:
            json_value(value)
        except (ValueError, RecursionError):  # nested past what the parser reads
            raise ValueError("must be JSON text") from None
    return value


class AuditEvent(BaseModel):
    """One audit event a packet carries; ``event_id`` makes it idempotent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: Guid
    occurred_at_utc: Stamp
    actor: AuditActor
    action: _Action
    outcome: Literal["Success", "Failure", "Denied"]
    category: _Category
    target: _Target | None = None
    source_node: _Node | None = None
    correlation_id: Guid | None = None
    details_json: Annotated[str | None, AfterValidator(_json_text)] = None
    payload_truncated: Annotated[bool, Strict()] = False


class TelemetryPacket(BaseModel):
    """One lifecycle report of one cached call (``tracked_operation_id``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tracked_operation_id: Guid
    channel: Channel
    target: CallTarget
    source_site: SiteName
    source_node: _Node | None = None
    status: SiteCallStatus
    retry_count: Integer = Field(0, ge=0, le=2**31 - 1)
    last_error: _LastError | None = None
    http_status: Integer | None = Field(None, ge=100, le=599)
    created_at_utc: Stamp
    updated_at_utc: Stamp
    terminal_at_utc: Stamp | None = None
    epoch: Integer = Field(0, ge=0, le=2**31 - 1, description="absent means 0")
    audit_event: AuditEvent | None = None

    @model_validator(mode="after")
    def _terminal_time(self) -> TelemetryPacket:
        terminal = self.status in TERMINAL
        if terminal and self.terminal_at_utc is None:
            raise ValueError(f"terminal_at_utc is required for status {self.status.value}")
        if not terminal and self.terminal_at_utc is not None:
            raise ValueError(f"terminal_at_utc must be null for status {self.status.value}")
        return self


def foreign_source(source_site: str, owner: str) -> str | None:
    """Why a packet naming ``source_site`` must not touch a call owned by ``owner`` (the
    site that reported it first, or the site it was pulled from); ``None`` when it may.
    A call belongs to one site for life: no packet moves it to another
    (docs/decisions.md "A call belongs to the site that reported it first")."""
    if source_site == owner:
        return None
    return f"source_site: the call belongs to site {owner!r}, not {source_site!r}"


def describe_errors(error: ValidationError) -> str:
    """One line per problem, each naming its field (``audit_event.actor: ...``), in the
    contract's own words where pydantic's would hide what was sent: a text's length
    against its width, an empty text, our validators' sentences without pydantic's
    ``Value error,`` prefix."""
    parts = []
    for item in error.errors(include_url=False):
        where = ".".join(storable_text(str(part)) for part in item["loc"]) or "packet"
        parts.append(f"{where}: {_problem(item)}")
    return "; ".join(parts)


def _problem(item: ErrorDetails) -> str:
    context = item.get("ctx", {})
    if item["type"] == "string_too_long":
        return f"{len(item['input'])} characters; at most {context['max_length']}"
    if item["type"] == "string_too_short" and context["min_length"] == 1:
        return "must not be empty"
    if item["type"] == "string_unicode":  # a lone surrogate, as ``storable`` says it
        return "must be valid Unicode text (an unpaired surrogate)"
    if item["type"] == "value_error":
        return str(context["error"])
    return item["msg"]


def validated(model: type[Contract], data: dict[Any, Any], what: str) -> Contract:
    """``data`` (a decoded JSON object) as ``model``. Raises ``ValueError`` naming every
    field at fault, ``"<name>: <why>"`` joined by ``"; "``: first each name ``model``
    does not declare (``"<name>: not a field of <what>"``, as storable text: a name
    holding a lone surrogate would make pydantic's own error name no field), then what
    ``describe_errors`` says of the rest."""
    problems = [
        f"{storable_text(str(name))}: not a field of {what}"
        for name in data
        if name not in model.model_fields
    ]
    known = {name: value for name, value in data.items() if name in model.model_fields}
    try:
        result = model.model_validate(known)
    except ValidationError as error:
        raise ValueError("; ".join([*problems, describe_errors(error)])) from None
    if problems:
        raise ValueError("; ".join(problems))
    return result


def validate_packet(data: Any) -> TelemetryPacket:
    """The packet in ``data`` (a decoded JSON value). Raises ``TelemetryRejected``."""
    if not isinstance(data, dict):
        raise TelemetryRejected(f"a packet must be a JSON object, not {type(data).__name__}")
    try:
        return validated(TelemetryPacket, data, "a telemetry packet")
    except ValueError as error:
        raise TelemetryRejected(str(error)) from None


def parse_packet(body: bytes) -> TelemetryPacket:
    """The packet in ``body`` (UTF-8 JSON, a byte order mark allowed). Raises
    ``TelemetryRejected``."""
    try:
        # Decoded first: json.loads of bytes would detect UTF-16 and UTF-32 too.
        data = json_value(body.decode("utf-8-sig"))
    except (ValueError, RecursionError) as error:
        raise TelemetryRejected(f"the packet is not UTF-8 JSON: {error}") from None
    return validate_packet(data)


def rejection_id(packet: bytes, *, kind: str = "") -> str:
    """Deterministic id of a rejected packet: the same bytes of one ``kind`` (telemetry:
    none; a notification: its source's prefix) always get the same id, and the same
    bytes refused as two kinds get two ids (each kept, each listed with its own)."""
    return str(uuid.UUID(bytes=hashlib.sha256(kind.encode() + packet).digest()[:16]))


def packet_bytes(data: Any) -> bytes:
    """A decoded packet as JSON bytes, to keep it whole when it is rejected."""
    return json.dumps(data, ensure_ascii=False, sort_keys=True, default=str).encode(
        "utf-8", "backslashreplace"
    )
