"""Settings: environment (``CONTROLROOM_*``, nested with ``__``), an optional TOML file, defaults.

Precedence, highest first: keyword arguments, environment variables, the TOML file
given with ``--config`` (or ``CONTROLROOM_CONFIG``), the defaults below. Source of the
names and defaults: docs/design.md "Operational contract".
"""

from __future__ import annotations

import base64
import binascii
import difflib
import re
from datetime import timedelta
from pathlib import Path
from typing import ClassVar, Literal, Unpack
from urllib.parse import SplitResult, unquote, urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    SettingsConfigDict,
)

from controlroom.db.engine import database_url_problem
from controlroom.db.providers import EMBEDDED
from controlroom.event_types import EventType
from controlroom.runtime.addresses import url_host
from controlroom.settings_sources import (
    CENTURY_DAYS,
    MAX_BYTES,
    MAX_COUNT,
    MAX_PREFETCH,
    MAX_QUEUE_NAME_BYTES,
    MIN_INTERVAL_SECONDS,
    PORT_PROBLEM,
    BearerSecret,
    EnvThenTomlSettings,
    ListenHost,
    ListenOverrides,
    Period,
    Seconds,
    SettingsTable,
    SiteId,
    WholeDays,
    expand_home,
    http_url_problem,
    is_host,
    one_secret_per_direction,
)

MIN_BACKOFF_SECONDS = 0.01
"""The shortest cap of a back-off: less asks a failing store again in a busy loop."""


class IngestionSettings(SettingsTable):
    """How the error queue is drained into the store."""

    batch_size: int = Field(200, ge=1, le=10_000, description="Messages per write batch.")
    concurrent_batches: int = Field(2, ge=1, le=64, description="Batches written at once.")
    linger_seconds: Seconds = Field(
        0.05, ge=0, le=10, description="How long a partial batch waits for more messages."
    )
    prefetch: int = Field(
        0,
        ge=0,
        le=MAX_PREFETCH,
        description="Broker prefetch; 0 means batch_size * concurrent_batches.",
    )
    max_inflight_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1,
        le=MAX_BYTES,
        description=(
            "Bytes of messages (body plus header text) an intake holds unacknowledged at once, "
            "besides the prefetch count; a larger message is taken alone."
        ),
    )
    max_backoff_seconds: Seconds = Field(
        30.0,
        ge=MIN_BACKOFF_SECONDS,
        description="Cap of the back-off while the database is unreachable.",
    )
    report_interval_seconds: Seconds = Field(
        10.0,
        ge=MIN_INTERVAL_SECONDS,
        description="How often serve logs what each intake did, while it has work.",
    )
    alert_group_failures_per_hour: int | None = Field(
        None,
        ge=1,
        le=MAX_COUNT,
        description=(
            "Failures of one group within one clock hour (of their failure time) whose "
            "reaching raises GroupFailuresPassedThreshold in the batch that reaches it; "
            "none: not watched."
        ),
    )
    alert_endpoint_failures_per_hour: int | None = Field(
        None,
        ge=1,
        le=MAX_COUNT,
        description=(
            "Unresolved failed messages of one receiving endpoint whose last failure is "
            "within one clock hour, whose reaching raises EndpointFailuresPassedThreshold "
            "in the batch that reaches it; none: not watched."
        ),
    )
    stop_grace_seconds: Seconds = Field(
        30.0,
        gt=0,
        le=600,
        description=(
            "After a stop (SIGTERM), how long a batch in hand keeps retrying a store that "
            "is busy or unreachable before it goes back to the queue unwritten."
        ),
    )
    stall_seconds: Seconds = Field(
        300.0,
        gt=0,
        description=(
            "Health reports an intake degraded when its queue has held messages this long "
            "without a batch stored."
        ),
    )

    workers: int = Field(
        1,
        ge=0,
        le=32,
        description=(
            "Worker processes serve starts for intake, retries' sends and notification "
            "dispatch, at a lower CPU priority than the API and the console; 0 runs them in "
            "serve's own process."
        ),
    )
    nice: int = Field(
        10, ge=0, le=19, description="How much the workers lower their CPU priority (os.nice)."
    )
    scheduling: Literal["normal", "idle"] = Field(
        "normal",
        description=(
            "The workers' and their local PostgreSQL backends' scheduling policy: 'idle' is "
            "Linux's SCHED_IDLE (the console's process preempts them at once; they run on "
            "what the rest leave), 'normal' keeps the default policy at the lowered nice."
        ),
    )

    cpu_cgroup: Path | None = Field(
        None,
        description=(
            "A cgroup directory (Linux) made for intake with a small CPU weight or cpu.idle: "
            "the workers move themselves and their local PostgreSQL backends into it, out of "
            "the kernel's autogroup, so the nice reaches the backends too. Needs write access "
            "to its cgroup.procs (root, or a delegated cgroup). None: the nice alone."
        ),
    )

    own_cgroup: bool = Field(
        True,
        description=(
            "Without cpu_cgroup, serve makes intake's cgroup itself where Linux lets it "
            "(root, or a delegated cgroup): beside serve's own, removed at stop, weighing the "
            "least the kernel takes while serve answers a read (for at most yield_to_reads "
            "of the time) and a nice-0 process's otherwise; elsewhere the nice alone."
        ),
    )

    yield_to_reads: float = Field(
        0.2,
        ge=0,
        le=1,
        description=(
            "The most of the workers' time their store statements spend waiting while "
            "serve answers a read (GET or HEAD): 0 never waits, 1 waits as long as reads "
            "come; with a reader that never stops, intake keeps 1 minus this of its pace."
        ),
    )

    @field_validator("cpu_cgroup")
    @classmethod
    def _home_expanded(cls, directory: Path | None) -> Path | None:
        # Whether workers may join it is serve's check at start (workers.cgroup_problem):
        # commands that start no worker take the setting as it is.
        return None if directory is None else expand_home(directory)

    @model_validator(mode="after")
    def _cgroup_has_workers(self) -> IngestionSettings:
        if self.cpu_cgroup is not None and self.workers == 0:
            raise ValueError(
                "cpu_cgroup needs workers: with workers = 0 intake runs in serve, which "
                "never joins it (set workers, or unset cpu_cgroup)"
            )
        return self

    @model_validator(mode="after")
    def _prefetch_in_range(self) -> IngestionSettings:
        if not self.prefetch and self.batch_size * self.concurrent_batches > MAX_PREFETCH:
            raise ValueError(
                f"batch_size x concurrent_batches is {self.batch_size * self.concurrent_batches}"
                f", more than a prefetch may be ({MAX_PREFETCH}, AMQP's limit): lower one of "
                "them or set prefetch"
            )
        return self

    @property
    def effective_prefetch(self) -> int:
        """Deliveries an intake holds unacknowledged at once, 1 to ``MAX_PREFETCH``."""
        return self.prefetch or self.batch_size * self.concurrent_batches


class StartupSettings(SettingsTable):
    """What serve does when it starts before its store or broker (docs/design.md
    "Operational contract")."""

    wait_seconds: Seconds = Field(
        300.0,
        ge=0,
        description="Seconds serve waits, trying again with back-off, for an unreachable "
        "database or broker before it exits with an error; 0: exit at once.",
    )


class SiteCallSettings(SettingsTable):
    """The site-call mirror (docs/design.md "Site call audit")."""

    retention_days: WholeDays = Field(
        365,
        ge=1,
        le=CENTURY_DAYS,
        description="Terminal site calls older than this many days are purged.",
    )
    purge_interval_seconds: Seconds = Field(
        86_400.0,
        ge=MIN_INTERVAL_SECONDS,
        description="How often the site-call and audit-log purge runs.",
    )
    tombstone_days: WholeDays = Field(
        30,
        ge=1,
        le=CENTURY_DAYS,
        description=(
            "Days a purged call's tombstone is kept after the purge (so at least this long "
            "beyond retention_days): its late packets are rejected meanwhile."
        ),
    )
    rejected_retention_days: WholeDays = Field(
        90,
        ge=1,
        le=CENTURY_DAYS,
        description="Rejected telemetry older than this many days is purged.",
    )


MIN_BUDGET_SECONDS = 0.1
"""The shortest time budget of a telemetry write: less cannot hold one statement of a
busy store, and every batch would be given back for ever."""


class AuditSettings(SettingsTable):
    """The append-only audit log and the ingest of telemetry into it."""

    ingest_budget: Seconds = Field(
        20.0, ge=MIN_BUDGET_SECONDS, description="Seconds one chunk of telemetry may take to write."
    )
    row_budget: Seconds = Field(
        5.0,
        ge=MIN_BUDGET_SECONDS,
        description="Fresh seconds each packet gets when a failed chunk is written row by row.",
    )
    request_budget: Seconds = Field(
        30.0,
        ge=MIN_BUDGET_SECONDS,
        description="Seconds one telemetry request, queue batch or reconciliation page may "
        "hold the writer; what is left then is answered 503 (HTTP) or given back (queue).",
    )
    retention_days: WholeDays = Field(
        365,
        ge=1,
        le=CENTURY_DAYS,
        description="Audit events older than this many days are purged.",
    )


class KpiSettings(SettingsTable):
    """Site-call KPIs and their history."""

    interval: timedelta = Field(
        timedelta(hours=1),
        gt=timedelta(0),
        le=timedelta(days=CENTURY_DAYS),
        description="Window of failed_last_interval and delivered_last_interval.",
    )
    stuck_threshold: timedelta = Field(
        timedelta(minutes=10),
        gt=timedelta(0),
        le=timedelta(days=CENTURY_DAYS),
        description="A buffered call created, or a buffered notification due, longer ago "
        "than this is stuck.",
    )
    sample_seconds: Seconds = Field(
        60.0, ge=1.0, description="How often KPIs are sampled (a row per sample and scope)."
    )
    history_days: WholeDays = Field(
        90, ge=1, le=CENTURY_DAYS, description="How long KPI samples are kept."
    )
    alert_parked: int = Field(
        1,
        ge=1,
        le=MAX_COUNT,
        description="Parked site calls (globally, or of one site) whose reaching raises "
        "ParkedSiteCallsPassedThreshold at the sample that sees it.",
    )
    alert_stuck: int = Field(
        1,
        ge=1,
        le=MAX_COUNT,
        description="Stuck site calls (globally, or of one site) whose reaching raises "
        "StuckSiteCallsPassedThreshold at the sample that sees it.",
    )


_DOMAIN = re.compile(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*")


_HOST_NAME = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?\.?")
"""A name or address of ``allowed_hosts``: as a ``Host`` header carries it, no port."""

_QUEUE_NAME = re.compile(r"[A-Za-z0-9 _.:@#,/+-]+")
"""AMQP 0-9-1's queue-name characters, as the RabbitMQ client (pamqp) checks a declared
queue's name: ASCII letters and digits, space and ``_ . : @ # , / + -``."""


class ConfiguredSite(SettingsTable):
    """A site whose agent central pulls and relays commands to (docs/design.md
    "Reconciliation", "Retry/Discard relay")."""

    id: SiteId = Field(description="The site's source_site in its telemetry.")
    base_url: str = Field(description="The agent's base URL (http:// or https://).")
    token: BearerSecret | None = Field(
        None,
        description="Bearer token central presents to the agent to pull and relay (the "
        "agent's CONTROLROOM_SITE_TOKEN; secret).",
    )
    central_token: BearerSecret | None = Field(
        None,
        description="Bearer token the agent presents to central (its "
        "CONTROLROOM_SITE_CENTRAL_TOKEN; secret): it may post this site's telemetry only.",
    )
    recipient_domains: list[str] = Field(
        default_factory=list,
        description="Domains whose addresses this site's notifications may name instead "
        "of a recipient list (exact, without case: example.org does not admit "
        "mail.example.org). Empty: none, the site mails recipient lists only.",
    )

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, url: str) -> str:
        """Usable, holding no credentials (``GET /api/sites`` shows it to readers), and
        no query or fragment (central adds the agent's paths after it)."""
        problem = http_url_problem(url, credentials=False, base=True)
        if problem:
            raise ValueError(problem)
        return url

    @field_validator("recipient_domains")
    @classmethod
    def _domains(cls, domains: list[str]) -> list[str]:
        for domain in domains:
            if not _DOMAIN.fullmatch(domain):
                raise ValueError(f"{domain!r} is not a domain name (ASCII, xn-- when not)")
        return [domain.lower() for domain in domains]

    @model_validator(mode="after")
    def _one_secret_per_direction(self) -> ConfiguredSite:
        one_secret_per_direction(self.token, self.central_token)
        return self


class ReconciliationSettings(SettingsTable):
    """Reconciliation pulls from the sites and the Retry/Discard relay (docs/design.md
    "Reconciliation", "Retry/Discard relay")."""

    interval: Period = Field(
        timedelta(minutes=5),
        ge=timedelta(seconds=MIN_INTERVAL_SECONDS),
        description="Time between two passes.",
    )
    probe_interval: Period = Field(
        timedelta(seconds=30),
        ge=timedelta(seconds=MIN_INTERVAL_SECONDS),
        description="Time between pulls of a site the last pass could not reach (a site "
        "coming back is reconciled within this).",
    )
    first_pass_delay: Period = Field(
        timedelta(0),
        ge=timedelta(0),
        description="Time after start-up before the first pass, for sites that start with "
        "central (the demo's: 10 s); an operator's pass or relay is not held back.",
    )
    batch_size: int = Field(500, ge=1, le=5000, description="Rows per page of a pull.")
    max_pages_per_pass: int = Field(
        20, ge=1, le=MAX_COUNT, description="Pages pulled from one site in one pass at most."
    )
    request_timeout: Seconds = Field(
        10.0, gt=0, description="Seconds a site may take to answer one page or command."
    )
    lease_seconds: Seconds = Field(
        600.0, gt=0, description="How long the lease of the periodic passes outlives its holder."
    )


_HEADER_SAFE = re.compile(r"^[^\r\n]*$")
_ADDRESS = re.compile(r"^[^@\s<>,;\"]+@[^@\s<>,;\"]+$")
_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")
_WEBHOOK_SECRET = re.compile(r"whsec_[A-Za-z0-9+/]+={0,2}")


class SmtpSettings(SettingsTable):
    """The mail server notifications go out through (docs/design.md "Notification
    outbox"). A TLS or login failure is a configuration error, never a plaintext
    fallback."""

    host: str = Field(description="The server's host name or IP address.")
    port: int = Field(25, ge=1, le=65535)
    sender: str = Field("controlroom@localhost", description="The From address.")
    starttls: bool = Field(False, description="Upgrade the connection with STARTTLS.")
    tls: bool = Field(False, description="Connect over TLS from the start (port 465).")
    username: str = Field("", pattern=_HEADER_SAFE.pattern, description="Login; empty: none.")
    password: SecretStr | None = Field(None, description="The login's password (secret).")

    @field_validator("host")
    @classmethod
    def _host(cls, host: str) -> str:
        if not is_host(host):
            raise ValueError(
                "it must be the mail server's host name or IP address (mail.example.org), "
                "without scheme, port or path"
            )
        return host

    @field_validator("sender")
    @classmethod
    def _plain_address(cls, sender: str) -> str:
        if not _ADDRESS.fullmatch(sender):
            raise ValueError(
                "it must be one plain address, local@domain (no display name, no <>, no space)"
            )
        return sender

    @model_validator(mode="after")
    def _one_tls(self) -> SmtpSettings:
        if self.starttls and self.tls:
            raise ValueError("set starttls or tls, not both")
        return self

    @model_validator(mode="after")
    def _login_whole(self) -> SmtpSettings:
        """The dispatcher logs in only with a username: a password alone is never used."""
        if self.password is not None and not self.username:
            raise ValueError("a password needs a username (smtp.username) to log in with")
        return self


class WebhookChannel(SettingsTable):
    """A named webhook: notifications whose target is ``name`` are POSTed to ``url``,
    signed with ``secret`` (Standard Webhooks, docs/design.md "Notification outbox")."""

    name: str = Field(min_length=1, max_length=256, pattern=_HEADER_SAFE.pattern)
    url: str = Field(description="Where it POSTs (http:// or https://).")
    secret: SecretStr = Field(
        description="The signing secret, whsec_ then base64 (secret: never shown)."
    )
    format: Literal["standard", "slack"] = Field(
        "standard",
        description="The body's shape: the outbox's JSON, or Slack's incoming-webhook "
        '{"text": ...} (still signed).',
    )

    @property
    def origin(self) -> str:
        """``url`` as shown and logged: ``scheme://host[:port]``. The rest is left out:
        a webhook's path is often its secret (a Slack incoming webhook's is), and a
        user and password may precede the host."""
        parts = urlsplit(self.url)
        port = f":{parts.port}" if parts.port is not None else ""
        host = parts.hostname or ""
        return f"{parts.scheme}://{url_host(host)}{port}"

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        problem = http_url_problem(url)
        if problem:
            raise ValueError(problem)
        return url

    @field_validator("secret")
    @classmethod
    def _standard_secret(cls, secret: SecretStr) -> SecretStr:
        value = secret.get_secret_value()
        if not _WEBHOOK_SECRET.fullmatch(value):
            raise ValueError("a webhook secret is whsec_ followed by base64")
        try:
            key = base64.b64decode(value.removeprefix("whsec_"), validate=True)
        except binascii.Error as exc:
            raise ValueError("a webhook secret is whsec_ followed by base64") from exc
        if len(key) < 16:
            raise ValueError("a webhook secret holds at least 16 bytes")
        return secret


class RecipientList(SettingsTable):
    """A named list of e-mail addresses: notifications whose target is ``name`` mail
    each of ``addresses``."""

    name: str = Field(min_length=1, max_length=256, pattern=_HEADER_SAFE.pattern)
    addresses: list[str] = Field(min_length=1)

    @field_validator("addresses")
    @classmethod
    def _addresses(cls, addresses: list[str]) -> list[str]:
        """An address goes into a header: one with a CR, LF or a second address is
        refused (docs/design.md "Notification outbox")."""
        for address in addresses:
            if len(address) > 254 or not _ADDRESS.fullmatch(address):
                raise ValueError("each address is one plain address, local@domain")
        if len(set(addresses)) != len(addresses):
            raise ValueError("an address is listed twice")
        return addresses


class NotificationRule(SettingsTable):
    """A rule: event log items of ``event_types`` (optionally only those related to
    ``related_to``, e.g. ``/site/plant-7``, to an ``endpoint``, a failure ``group`` or a
    ``site``, and at least ``min_severity``) make one notification per ``window`` to
    ``target`` over ``channel``, saying how many there were (docs/design.md "Notification
    rules")."""

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    event_types: list[str] = Field(
        min_length=1,
        description="Event types it reacts to, each one Controlroom writes (README "
        '"Notification outbox": Events a rule can name).',
    )
    related_to: str | None = Field(None, description="Only events related to this path.")
    endpoint: str | None = Field(None, description="Only events related to this endpoint.")
    group: str | None = Field(None, description="Only events related to this failure group.")
    site: str | None = Field(
        None, description="Only events related to this site (one configured in sites)."
    )
    min_severity: Literal["info", "warning", "error", "critical"] = Field(
        "info", description="Only events at least this severe (the event log's severities)."
    )
    channel: Literal["Email", "Webhook"]
    target: str = Field(min_length=1, max_length=256, description="Webhook or list name.")
    severity: Literal["Info", "Warning", "Error", "Critical"] = "Warning"
    window: timedelta = Field(
        timedelta(minutes=5),
        gt=timedelta(0),
        le=timedelta(days=7),
        description="Events of one window make one notification, sent when it ends (at "
        "most a week).",
    )


class NotificationSettings(SettingsTable):
    """The notification outbox: channels, recipient lists and the dispatcher's rules
    (docs/design.md "Notification outbox")."""

    smtp: SmtpSettings | None = Field(None, description="The mail server; none: no e-mail.")
    webhooks: list[WebhookChannel] = Field(default_factory=list)
    recipient_lists: list[RecipientList] = Field(default_factory=list)
    rules: list[NotificationRule] = Field(default_factory=list)
    max_attempts: int = Field(
        10, ge=1, le=MAX_COUNT, description="Failed attempts that park a notification."
    )
    backoff_base: timedelta = Field(
        timedelta(seconds=10),
        gt=timedelta(0),
        le=timedelta(days=1),
        description="Wait after the first failure.",
    )
    backoff_cap: timedelta = Field(
        timedelta(minutes=15),
        gt=timedelta(0),
        le=timedelta(days=7),
        description="Longest wait between attempts.",
    )
    retry_after_cap: timedelta = Field(
        timedelta(hours=1),
        gt=timedelta(0),
        le=timedelta(days=7),
        description="Longest Retry-After of a receiver honoured (429, 503).",
    )
    retention_days: WholeDays = Field(
        365,
        ge=1,
        le=CENTURY_DAYS,
        description="Terminal notifications older than this many days are purged.",
    )
    purge_interval_seconds: Seconds = Field(
        86_400.0, ge=MIN_INTERVAL_SECONDS, description="How often the notification purge runs."
    )
    dispatch_interval_seconds: Seconds = Field(
        2.0,
        ge=MIN_INTERVAL_SECONDS,
        description="How often the dispatcher looks for due notifications.",
    )
    batch_size: int = Field(100, ge=1, le=1000, description="Notifications claimed at once.")
    concurrency: int = Field(16, ge=1, le=256, description="Sends under way at once.")
    send_timeout: Seconds = Field(30.0, gt=0, description="Seconds one send may take.")
    claim_seconds: Seconds = Field(
        300.0,
        gt=0,
        le=86_400,
        description="How long a claimed notification stays another dispatcher's to send; "
        "a dispatcher killed mid-send leaves it due again after this.",
    )

    @model_validator(mode="after")
    def _coherent(self) -> NotificationSettings:
        if self.claim_seconds <= self.send_timeout:
            raise ValueError("claim_seconds must exceed send_timeout")
        if self.backoff_cap < self.backoff_base:
            raise ValueError(
                "backoff_cap is below backoff_base: waits grow from the base up to the cap"
            )
        for kind, names in (
            ("webhooks", [hook.name for hook in self.webhooks]),
            ("recipient_lists", [entry.name for entry in self.recipient_lists]),
        ):
            if len(set(names)) != len(names):
                raise ValueError(f"two {kind} share a name; each name must be distinct")
        if self.recipient_lists and self.smtp is None:
            raise ValueError("recipient_lists need an smtp server (notifications.smtp)")
        if len({rule.name for rule in self.rules}) != len(self.rules):
            raise ValueError("two rules share a name; each name must be distinct")
        for index, rule in enumerate(self.rules):
            for kind in rule.event_types:
                if kind not in _EVENT_TYPES:
                    raise ValueError(_unknown_event_type(index, rule.name, kind))
            if rule.channel == "Webhook":
                where, names = "webhooks", [hook.name for hook in self.webhooks]
            else:
                where, names = "recipient_lists", [entry.name for entry in self.recipient_lists]
            if rule.target not in names:
                raise ValueError(
                    f"rules: rule {rule.name!r} names {rule.channel} target {rule.target!r}, "
                    f"which is not configured (notifications.{where} names: "
                    f"{', '.join(names) or 'none'})"
                )
        return self

    def webhook(self, name: str) -> WebhookChannel | None:
        """The webhook named ``name``, if configured."""
        return next((hook for hook in self.webhooks if hook.name == name), None)

    def recipients(self, name: str) -> RecipientList | None:
        """The recipient list named ``name``, if configured."""
        return next((entry for entry in self.recipient_lists if entry.name == name), None)


_EVENT_TYPES = frozenset(kind.value for kind in EventType)


def _unknown_event_type(index: int, rule: str, kind: str) -> str:
    """The refusal of a rule's event type that Controlroom never writes (a misspelt one
    would be accepted and never match), with the closest known one."""
    close = difflib.get_close_matches(kind, sorted(_EVENT_TYPES), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return (
        f"rules[{index}].event_types: rule {rule!r} names {kind!r}, an event type "
        f'Controlroom never writes{hint} (the event types: README "Notification outbox")'
    )


_ORIGIN = re.compile(r"https?://[^/\s:]+(:\d{1,5})?")

Role = Literal["reader", "operator", "admin"]
"""What a bearer token may do: ``reader`` GET/HEAD; ``operator`` also archive, retry and
edit; ``admin`` also delete endpoints (``controlroom.api.auth``)."""


class AuthToken(SettingsTable):
    """One bearer token of the API and the role it grants.

    ``token`` is a secret: a ``SecretStr``, so it never shows in a repr, a log line or
    ``/api/configuration``; ``name`` says whose it is wherever the API names the caller.
    """

    name: str = Field(min_length=1, max_length=100, description="Who holds the token.")
    token: BearerSecret = Field(description="The bearer token (secret).")
    role: Role

    @field_validator("name")
    @classmethod
    def _name_printable(cls, name: str) -> str:
        """The name is the actor of its holder's audit events and retries: a control
        character (PostgreSQL refuses a NUL in text) would fail every action it takes."""
        if not name.strip() or not name.isprintable():
            raise ValueError("a token's name is printable text, not only space")
        return name


def _split_host_and_port(url: str) -> SplitResult:
    """``url``'s parts, once its host's brackets and its port are read.

    Raises ``ValueError`` naming the part (never quoting the URL: it may hold a password)
    when a bracket breaks the host or the port is no number from 0 to 65535."""
    try:
        parts = urlsplit(url)
    except ValueError:  # "[::1" or "[127.0.0.1]"
        raise ValueError(
            "its host must be a host name or an IP address; an IPv6 address goes in "
            "brackets ([::1]), an IPv4 address without"
        ) from None
    try:
        _ = parts.port  # reading it checks it
    except ValueError:
        unbracketed = parts.netloc.rpartition("@")[2].count(":") > 1  # u@::1:5432
        hint = " (an IPv6 address goes in brackets: [::1])" if unbracketed else ""
        raise ValueError(PORT_PROBLEM + hint) from None
    return parts


class Settings(EnvThenTomlSettings):
    """Everything Controlroom can be told. Sizes are bytes, periods are ``timedelta``."""

    config_file_variable: ClassVar[str] = "CONTROLROOM_CONFIG"

    # Validation errors name the setting but never echo its value: values include bearer
    # tokens and URLs with passwords, and the CLI prints these errors.
    model_config = SettingsConfigDict(
        env_prefix="CONTROLROOM_",
        env_nested_delimiter="__",
        extra="forbid",
        hide_input_in_errors=True,
        allow_inf_nan=False,  # a "nan" or "inf" duration or size is refused as no number
    )

    data_dir: Path = Path("./controlroom-data")
    database_url: str = Field(
        "",
        description="The store of serve and of every command but migrate (on PostgreSQL, "
        "the service role's URL when migration_database_url is set).",
    )
    migration_database_url: str = Field(
        "",
        description="The schema owner's URL, used by migrate alone (PostgreSQL): migrate then "
        "makes database_url's user the service role, which may only insert into and read "
        "the audit log. Empty: migrate uses database_url.",
    )
    broker_url: str = Field(
        "", description="RabbitMQ (amqp:// or amqps://); empty: the embedded queue."
    )
    error_queue: str = "error"
    telemetry_queue: str = "site-call-telemetry"
    host: ListenHost = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535, description="0: any free port.")
    max_body_size_to_store: int = Field(102_400, ge=0, le=MAX_BYTES)
    error_retention_period: timedelta = Field(
        timedelta(days=15),
        gt=timedelta(0),
        le=timedelta(days=CENTURY_DAYS),
        description="Resolved and archived failed messages older than this are purged.",
    )
    event_log_retention_period: timedelta = Field(
        timedelta(days=14),
        gt=timedelta(0),
        le=timedelta(days=CENTURY_DAYS),
        description="How long event log items are kept (ServiceControl's default: 14 days); "
        "the retention sweep purges older ones.",
    )
    exact_count_limit: int = Field(
        10_000,
        ge=1,
        le=MAX_COUNT,
        description="Lists count their matches exactly up to this many; beyond it the "
        "database's estimate is answered, marked Total-Count-Estimated: true (PostgreSQL; "
        "SQLite has no estimate and counts exactly).",
    )
    ingest_on_serve: bool = True
    ingestion: IngestionSettings = IngestionSettings()
    startup: StartupSettings = StartupSettings()
    sitecalls: SiteCallSettings = SiteCallSettings()
    audit: AuditSettings = AuditSettings()
    sites: list[ConfiguredSite] = Field(
        default_factory=list, description="Site agents to reconcile from and relay to."
    )
    reconciliation: ReconciliationSettings = ReconciliationSettings()
    kpi: KpiSettings = KpiSettings()
    notifications: NotificationSettings = NotificationSettings()
    auth_tokens: list[AuthToken] = Field(
        default_factory=list,
        description="Bearer tokens of the API, each with a name and a role. None: the API "
        "is open, which serve allows on a loopback address only.",
    )
    cors_allowed_origins: list[str] = Field(
        default_factory=list,
        description="Origins (scheme://host[:port], or '*') whose web pages may call the "
        "API from a browser, e.g. a ServicePulse on another host. None by default: only "
        "same-origin pages.",
    )
    access_log: bool = Field(
        True,
        description="A line per HTTP request in serve's log (uvicorn's access log, stamped as "
        "serve's own lines); false: none (/metrics counts the requests).",
    )
    max_request_body_size: int = Field(
        10 * 1024 * 1024,
        ge=1024,
        le=MAX_BYTES,
        description="Largest HTTP request body accepted, in bytes; larger ones are "
        "answered 413 before they are read.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Names this server answers to besides its bound address and "
        "localhost/127.0.0.1/[::1] at its port (e.g. the name a reverse proxy forwards); "
        "any other Host header is refused (DNS rebinding).",
    )
    servicecontrol_api_version: str = Field(
        "6.15.0",
        description="The ServiceControl version whose behaviour Controlroom implements, sent as "
        "X-Particular-Version on every /api response; clients such as ServicePulse "
        "enable features by it.",
    )

    @field_validator("database_url", "migration_database_url", "broker_url")
    @classmethod
    def _port_is_a_port(cls, url: str) -> str:
        """A URL whose host a bracket breaks, or whose port is no number from 1 to 65535,
        is refused here, in one line that never quotes it (it may hold a password), not
        by the driver when it connects. Port 0 is refused by each URL's own check."""
        _split_host_and_port(url)
        return url

    @field_validator("database_url", "migration_database_url")
    @classmethod
    def _database_url(cls, url: str) -> str:
        """A URL SQLAlchemy cannot parse, of a database or driver no provider serves, or
        that its provider finds unusable (``db.engine.database_url_problem``: a PostgreSQL
        URL naming no database) is refused here naming the setting, never quoted (it may
        hold a password); empty is the
        default (``database_url``: the embedded store; ``migration_database_url``: the
        same as ``database_url``)."""
        problem = database_url_problem(url) if url else None
        if problem is not None:
            raise ValueError(problem)
        return url

    @field_validator("broker_url")
    @classmethod
    def _amqp_or_none(cls, url: str) -> str:
        """An address that is no AMQP URL (``amqp//`` missing its colon, ``http://``, a host
        no resolver takes, port 0, white space: a vhost " ") is refused here, never quoted
        (it may hold a password), not retried for ever."""
        if not url:
            return url
        parts = _split_host_and_port(url)
        if any(character.isspace() for character in url):
            raise ValueError("it must be a URL without white space")
        if "\x00" in unquote(url):  # the broker would be asked for a vhost or user cut short
            raise ValueError("no part of it may hold a NUL (%00)")
        if parts.scheme.lower() not in ("amqp", "amqps"):
            raise ValueError(
                "it must be an amqp:// or amqps:// URL, or empty for the embedded queue"
            )
        if not parts.hostname or not is_host(parts.hostname):
            raise ValueError("its host is no host name or IP address")
        if parts.port == 0:
            raise ValueError(PORT_PROBLEM)
        return url

    @field_validator("data_dir", mode="before")
    @classmethod
    def _data_dir_named(cls, value: object) -> object:
        """An empty value would be the current directory (``Path("")``), not the default."""
        if isinstance(value, str) and not value.strip():
            raise ValueError(
                "it is empty: unset it for ./controlroom-data, or name a directory "
                "(. for the current one)"
            )
        if isinstance(value, str) and not value.isprintable():
            raise ValueError(
                "a path holds no control character and no white space but the space "
                "(NUL, a line break, a tab, a no-break space)"
            )
        return value

    @field_validator("data_dir")
    @classmethod
    def _data_dir_a_directory(cls, path: Path) -> Path:
        """Made when missing; one that names a file, or lies under one, would fail in
        every part using it. A leading ``~`` is the user's home, as a shell reads it."""
        path = expand_home(path)
        if path.exists() and not path.is_dir():
            raise ValueError(f"it names a file, not a directory: {path}")
        above = next((parent for parent in path.parents if parent.exists()), None)
        if above is not None and not above.is_dir():
            raise ValueError(f"it is under a file, not a directory: {above}")
        return path

    @field_validator("error_queue", "telemetry_queue")
    @classmethod
    def _queue_name(cls, name: str) -> str:
        """A queue's name: 1 to ``MAX_QUEUE_NAME_BYTES`` characters of AMQP 0-9-1's
        queue-name domain (``_QUEUE_NAME``, what aio-pika's pamqp declares), not only white
        space nor beginning or ending with it, outside RabbitMQ's reserved ``amq.`` names,
        as both transports take it, checked at start rather than by an intake that then
        fails at every try."""
        if not 1 <= len(name) <= MAX_QUEUE_NAME_BYTES:
            raise ValueError(f"a queue's name is 1 to {MAX_QUEUE_NAME_BYTES} characters")
        if not _QUEUE_NAME.fullmatch(name):
            raise ValueError(
                "a queue's name is letters, digits, space and - _ . : @ # , / + "
                "(AMQP's queue names, ASCII)"
            )
        if not name.strip():
            raise ValueError("a queue's name is not only white space")
        if name != name.strip():  # " error" is another queue than "error", by mistake
            raise ValueError("a queue's name neither begins nor ends with a space")
        if name.startswith("amq."):
            raise ValueError("RabbitMQ reserves the names that start with amq.")
        return name

    @model_validator(mode="after")
    def _queues_apart(self) -> Settings:
        """One queue for both would give telemetry packets to the error queue's intake
        (failed imports: no ``NServiceBus.FailedQ``) and failed messages to the telemetry
        intake (rejected packets)."""
        if self.error_queue == self.telemetry_queue:
            raise ValueError(
                f"error_queue and telemetry_queue are both {self.error_queue!r}: each intake "
                "needs a queue of its own"
            )
        return self

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, names: list[str]) -> list[str]:
        """Each a name as a ``Host`` header gives it, whose port is not compared: a scheme,
        a port, a path or ``*`` would never match, and every request would get 421."""
        for name in names:
            if not _HOST_NAME.fullmatch(name):
                raise ValueError(
                    f"{name[:100]!r}: each name is a host name or address without scheme, "
                    "port or path (proxy.example, 10.0.0.5, [fd00::5]); any port matches"
                )
        return names

    @field_validator("auth_tokens")
    @classmethod
    def _distinct_tokens(cls, tokens: list[AuthToken]) -> list[AuthToken]:
        """Two entries with one token would make the caller's name and role ambiguous."""
        secrets = [entry.token.get_secret_value() for entry in tokens]
        if len(set(secrets)) != len(secrets):
            raise ValueError("two entries share a token; each token must be distinct")
        names = [entry.name for entry in tokens]
        if len(set(names)) != len(names):
            raise ValueError("two entries share a name; each name must be distinct")
        return tokens

    @field_validator("sites")
    @classmethod
    def _distinct_sites(cls, sites: list[ConfiguredSite]) -> list[ConfiguredSite]:
        """Telemetry and commands find a site by its id: two entries with one id would
        make that ambiguous."""
        ids = [site.id for site in sites]
        shared = sorted({site_id for site_id in ids if ids.count(site_id) > 1})
        if shared:
            named = ", ".join(repr(site_id) for site_id in shared)
            raise ValueError(f"two sites share the id {named}; each site id must be distinct")
        return sites

    @model_validator(mode="after")
    def _distinct_callers(self) -> Settings:
        """Each token central holds is one caller's, in one direction: an operator's token
        that is also a site's ``central_token`` or two sites sharing one would let one
        speak as the other; one that is also a site's ``token`` would be sent to that
        site on every pull (and the site could act as the operator, or pull from the
        other site). Refused naming the two places that share a token, never the token."""
        held = [(f"auth_tokens[{i}].token", e.token) for i, e in enumerate(self.auth_tokens)]
        for index, site in enumerate(self.sites):
            held += [
                (f"sites[{index}].{direction}", secret)
                for direction, secret in (
                    ("central_token", site.central_token),
                    ("token", site.token),
                )
                if secret is not None
            ]
        first_place: dict[str, str] = {}
        for place, secret in held:
            earlier = first_place.setdefault(secret.get_secret_value(), place)
            if earlier != place:
                raise ValueError(
                    f"a token is configured twice ({earlier} and {place}): each operator, "
                    "each site and each direction needs a token of its own"
                )
        return self

    @model_validator(mode="after")
    def _rules_name_configured_sites(self) -> Settings:
        """A rule's ``site`` filter naming a site not in ``sites`` would never match a
        reconciliation event: refused, naming the setting."""
        configured = {site.id for site in self.sites}
        for index, rule in enumerate(self.notifications.rules):
            if rule.site is not None and rule.site not in configured:
                raise ValueError(
                    f"notifications.rules[{index}].site: rule {rule.name!r} names site "
                    f"{rule.site!r}, which is not configured in sites (a site's telemetry "
                    f'events match related_to = "/site/<id>" without it)'
                )
        return self

    @field_validator("servicecontrol_api_version")
    @classmethod
    def _version(cls, version: str) -> str:
        """Sent in a header of every /api answer (Latin-1): ASCII digits only."""
        if not _VERSION.fullmatch(version):
            raise ValueError("it must be three numbers in ASCII digits, such as 6.15.0")
        return version

    @field_validator("cors_allowed_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        """A browser sends ``Origin`` as scheme://host[:port]; anything else never matches."""
        for origin in origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    "each origin must be scheme://host[:port] (no path, no trailing slash) or '*'"
                )
        return origins

    @property
    def effective_database_url(self) -> str:
        """The SQLAlchemy URL; the embedded database file in ``data_dir`` when none is set."""
        if self.database_url:
            return self.database_url
        return EMBEDDED.file_url(self.data_dir / "controlroom.db")

    @property
    def effective_migration_database_url(self) -> str:
        """The URL ``controlroom migrate`` connects with: the owner's when set, else the
        store's."""
        return self.migration_database_url or self.effective_database_url

    @property
    def body_dir(self) -> Path:
        """Root of the file-system body store."""
        return self.data_dir / "bodies"

    @property
    def embedded_queue_path(self) -> Path:
        """File of the embedded durable intake queue."""
        return self.data_dir / "queue.db"


def load_settings(
    config_file: Path | None = None, **overrides: Unpack[ListenOverrides]
) -> Settings:
    """Build the settings, reading ``config_file`` (TOML) when given.

    Raises ``pydantic.ValidationError`` naming the offending setting.
    """
    if config_file is None:
        return Settings(**overrides)

    class FileSettings(Settings):
        # A subclass per file keeps the choice local: no process-wide state changes.
        model_config = SettingsConfigDict(**{**Settings.model_config, "toml_file": config_file})

    read = FileSettings(**overrides)
    # Handed back as a plain Settings of the values read and validated: a class local to
    # this call cannot be pickled, and the settings travel pickled to serve's worker
    # processes (docs/design.md "Process shape").
    return Settings.model_construct(
        read.model_fields_set, **{name: getattr(read, name) for name in Settings.model_fields}
    )
