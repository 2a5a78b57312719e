"""The channels a notification travels by, each by its ecosystem's conventions
(docs/design.md "Notification channels"): a webhook (an ``httpx`` POST signed by the
Standard Webhooks scheme) and e-mail (SMTP through ``aiosmtplib``).

A sender turns one claimed notification into an ``Attempt``; it never raises for a
receiver's answer or a network failure, and holds no database connection.
"""

from __future__ import annotations

import base64
import contextlib
import email.policy
import email.utils
import hashlib
import hmac
import json
import logging
import re
import ssl
from collections.abc import Sequence
from datetime import datetime
from email.message import EmailMessage
from typing import Protocol

import aiosmtplib
import httpx

from controlroom.config import NotificationSettings, WebhookChannel
from controlroom.notifications.lifecycle import Attempt, Verdict
from controlroom.notifications.store import Claimed
from controlroom.runtime.clock import Clock

RETRIED_STATUSES = frozenset({408, 425, 429})
"""4xx answers that say "later", not "never"."""
RETRY_AFTER_STATUSES = frozenset({429, 503})
_DELAY_SECONDS = re.compile(r"[0-9]+")
"""``Retry-After``'s delay-seconds (RFC 9110 10.2.3): ASCII digits only (``str.isdigit``
also takes ``²`` and other scripts' digits)."""


class Sender(Protocol):
    """Sends one notification of its channel; answers the attempt's outcome."""

    async def send(self, claimed: Claimed) -> Attempt: ...


def sign(secret: str, message_id: str, timestamp: str, body: bytes) -> str:
    """The Standard Webhooks signature of ``body``: ``v1,`` and the base64 HMAC-SHA256 of
    ``id.timestamp.body`` under ``secret`` (``whsec_`` and the base64 key)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """A ``Retry-After`` header as seconds from ``now``: delay seconds (ASCII digits) or
    an HTTP date (a past one: 0); ``None`` when absent or nonsense, a negative or
    fractional number included (then the backoff applies). Not capped here: a huge delay
    is (``lifecycle.after_attempt``, ``retry_after_cap``)."""
    if value is None:
        return None
    text = value.strip(" \t")
    if _DELAY_SECONDS.fullmatch(text):
        return float(text)  # inf beyond float's range: capped all the same
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - now).total_seconds())


def _slack_escaped(text: str) -> str:
    """``text`` with Slack's three control characters escaped (``&``, ``<``, ``>``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(payload: str) -> bytes:
    """The Slack-compatible body of a stored webhook ``payload`` (docs/design.md
    "Notification channels"): ``{"text": ...}``, the severity and subject in bold, the body,
    then the notification's id and source. A pure function of the stored payload, so
    every attempt sends (and signs) the same bytes."""
    fields = json.loads(payload)
    text = (
        f"*{fields['severity']}: {_slack_escaped(fields['subject'])}*\n"
        f"{_slack_escaped(fields['body'])}\n"
        f"_{fields['notification_id']} from {_slack_escaped(fields['source'])}_"
    )
    return json.dumps({"text": text}, ensure_ascii=False, separators=(",", ":")).encode()


def http_verdict(status: int, retry_after: str | None, now: datetime) -> Attempt:
    """The outcome of a webhook answered ``status`` (docs/design.md "Notification
    channels"): 2xx delivered; 3xx a failed attempt, never followed; 410 parks; 408, 425,
    429 and 5xx retried (429 and 503 with their ``Retry-After``); other 4xx permanent."""
    if 200 <= status < 300:
        return Attempt(Verdict.DELIVERED, reply_code=status)
    if 300 <= status < 400:
        return Attempt(Verdict.RETRY, f"HTTP {status}: a redirect, not followed", reply_code=status)
    if status == 410:
        return Attempt(Verdict.PARK, "HTTP 410: the receiver is gone", reply_code=status)
    if 400 <= status < 500 and status not in RETRIED_STATUSES:
        return Attempt(Verdict.PERMANENT, f"HTTP {status}: refused", reply_code=status)
    wait = retry_after_seconds(retry_after, now) if status in RETRY_AFTER_STATUSES else None
    return Attempt(Verdict.RETRY, f"HTTP {status}", reply_code=status, retry_after=wait)


class _WebhookUrlsLeftOut(logging.Filter):
    """On the ``httpx`` logger: a request line naming a webhook's URL names its origin
    instead (``WebhookChannel.origin``): the path of a webhook is often its secret, and
    httpx logs every request's URL at INFO. Other URLs pass unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self._origins: dict[httpx.URL, str] = {}

    def add(self, hooks: Sequence[WebhookChannel]) -> None:
        for hook in hooks:
            self._origins[httpx.URL(hook.url)] = f"{hook.origin} (webhook {hook.name})"

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(
            isinstance(arg, httpx.URL) for arg in record.args
        ):
            record.args = tuple(
                self._origins.get(arg, arg) if isinstance(arg, httpx.URL) else arg
                for arg in record.args
            )
        return True


_URLS_LEFT_OUT = _WebhookUrlsLeftOut()
logging.getLogger("httpx").addFilter(_URLS_LEFT_OUT)


class WebhookSender:
    """POSTs a notification's stored payload to its webhook, signed; ``client`` must not
    follow redirects (``httpx``'s default). The log never names a webhook's URL beyond
    its origin (``_WebhookUrlsLeftOut``)."""

    def __init__(self, settings: NotificationSettings, client: httpx.AsyncClient, clock: Clock):
        self._settings = settings
        self._client = client
        self._clock = clock
        _URLS_LEFT_OUT.add(settings.webhooks)

    async def send(self, claimed: Claimed) -> Attempt:
        hook = self._settings.webhook(claimed.target)
        if hook is None:
            return Attempt(Verdict.PERMANENT, f"no webhook named {claimed.target!r}")
        if claimed.payload is None:
            return Attempt(Verdict.PERMANENT, "the notification has no webhook payload")
        body = (
            claimed.payload.encode() if hook.format == "standard" else slack_body(claimed.payload)
        )
        timestamp = str(int(self._clock().timestamp()))
        headers = {
            "content-type": "application/json",
            "webhook-id": claimed.notification_id,
            "webhook-timestamp": timestamp,
            "webhook-signature": sign(
                hook.secret.get_secret_value(), claimed.notification_id, timestamp, body
            ),
        }
        try:
            response = await self._client.post(
                hook.url, content=body, headers=headers, follow_redirects=False
            )
        except httpx.TimeoutException:
            return Attempt(Verdict.RETRY, f"webhook {hook.name!r}: timed out")
        except httpx.HTTPError as exc:
            return Attempt(Verdict.RETRY, f"webhook {hook.name!r}: {type(exc).__name__}: {exc}")
        return http_verdict(
            response.status_code, response.headers.get("retry-after"), self._clock()
        )


_LINE_BREAK = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
"""Every character ``str.splitlines`` breaks a line at: the e-mail package refuses a
header value holding any of them."""


def one_line(text: str) -> str:
    """``text`` with every line break (CR, LF and the Unicode ones, ``_LINE_BREAK``)
    replaced by a space: a header never takes a line from a notification's text."""
    return _LINE_BREAK.sub(" ", text)


def email_message(
    claimed: Claimed, sender: str, recipients: Sequence[str], now: datetime
) -> EmailMessage:
    """The e-mail of ``claimed`` to ``recipients``: ``Message-ID`` ``<id@controlroom>``,
    the subject on one line (an encoded word when not ASCII), the body as text."""
    message = EmailMessage(policy=email.policy.SMTP)
    message["Subject"] = one_line(claimed.subject)
    message["From"] = sender
    message["To"] = ", ".join(recipients)
    message["Date"] = email.utils.format_datetime(now)
    message["Message-ID"] = f"<{claimed.notification_id}@controlroom>"
    message["X-Controlroom-Severity"] = claimed.severity
    message.set_content(claimed.body)
    return message


def _tls_failure(exc: BaseException) -> bool:
    """``exc`` is, or was caused by, a TLS failure (a handshake or certificate refused)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


class SmtpSender:
    """Mails a notification to its recipient list, or to the addresses a site named
    (``claimed.recipients``), each recipient once: those in ``claimed.delivered_to`` are
    not mailed again (docs/design.md "Notification channels")."""

    def __init__(self, settings: NotificationSettings, timeout: float, clock: Clock):
        self._settings = settings
        self._timeout = timeout
        self._clock = clock

    async def send(self, claimed: Claimed) -> Attempt:
        # An unknown target fails for good, SMTP server or none (docs/design.md
        # "Notification channels"): no setting made later would make it known to this one.
        if claimed.recipients is not None:
            addresses: Sequence[str] = claimed.recipients
        else:
            recipients = self._settings.recipients(claimed.target)
            if recipients is None:
                return Attempt(Verdict.PERMANENT, f"no recipient list named {claimed.target!r}")
            addresses = recipients.addresses
        smtp = self._settings.smtp
        if smtp is None:
            return Attempt(Verdict.CONFIGURATION, "no SMTP server is configured")
        done = list(claimed.delivered_to)
        remaining = [address for address in addresses if address not in done]
        if not remaining:
            return Attempt(Verdict.DELIVERED, delivered_to=tuple(done))
        message = email_message(claimed, smtp.sender, remaining, self._clock())
        client = aiosmtplib.SMTP(
            hostname=smtp.host,
            port=smtp.port,
            use_tls=smtp.tls,
            start_tls=smtp.starttls,
            username=smtp.username or None,
            password=smtp.password.get_secret_value() if smtp.password else None,
            timeout=self._timeout,
        )
        try:
            await client.connect()  # and STARTTLS and the login, as configured
        except Exception as exc:
            return _connect_failure(exc)
        try:
            refused = await _submit(client, smtp.sender, message, remaining)
        except aiosmtplib.SMTPRecipientsRefused as exc:
            refused = {each.recipient: (each.code, each.message) for each in exc.recipients}
        except aiosmtplib.SMTPResponseException as exc:
            verdict = Verdict.PERMANENT if 500 <= exc.code < 600 else Verdict.RETRY
            return Attempt(verdict, f"SMTP {exc.code} {exc.message}", reply_code=exc.code)
        except (aiosmtplib.SMTPException, OSError) as exc:
            return Attempt(Verdict.RETRY, f"SMTP: {type(exc).__name__}: {exc}")
        finally:
            client.close()
        return _recipients_outcome(done, remaining, refused)


def _connect_failure(exc: Exception) -> Attempt:
    """The outcome of a failed connect: the network (unreachable, timed out, hung up) is
    retried; a TLS, STARTTLS or login failure, or any refusal of the greeting, is our
    side's configuration (docs/design.md "Notification channels")."""
    text = f"SMTP: {type(exc).__name__}: {exc}"
    network = (
        aiosmtplib.SMTPConnectError,
        aiosmtplib.SMTPTimeoutError,
        aiosmtplib.SMTPServerDisconnected,
        OSError,
    )
    if isinstance(exc, network) and not _tls_failure(exc):
        return Attempt(Verdict.RETRY, text)
    return Attempt(Verdict.CONFIGURATION, text)


async def _submit(
    client: aiosmtplib.SMTP, sender: str, message: EmailMessage, recipients: Sequence[str]
) -> dict[str, tuple[int, str]]:
    """Send ``message``; answers the recipients the server refused (code, text)."""
    errors, _ = await client.send_message(message, sender=sender, recipients=list(recipients))
    with contextlib.suppress(aiosmtplib.SMTPException, OSError):
        await client.quit()  # the message is accepted: a failed goodbye changes nothing
    return {address: (reply.code, reply.message) for address, reply in errors.items()}


def _recipients_outcome(
    done: list[str], remaining: list[str], refused: dict[str, tuple[int, str]]
) -> Attempt:
    """Delivered when every recipient has it; retried while one was refused for now
    (4xx); failed when every one left was refused for good (5xx)."""
    delivered = tuple(done + [address for address in remaining if address not in refused])
    if not refused:
        return Attempt(Verdict.DELIVERED, reply_code=250, delivered_to=delivered)
    error = "; ".join(f"{address}: {code} {text}" for address, (code, text) in refused.items())
    later = [code for code, _ in refused.values() if not 500 <= code < 600]
    verdict = Verdict.RETRY if later else Verdict.PERMANENT
    code = later[0] if later else next(iter(refused.values()))[0]
    return Attempt(verdict, f"SMTP refused {error}", reply_code=code, delivered_to=delivered)
