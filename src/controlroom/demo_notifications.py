"""The demo's notification receivers and the outbox settings that point at them
(docs/design.md "Notification outbox"): a webhook sink (HTTP) that accepts ``ops-chat``
and answers 500 to ``pager`` (so the pager's notifications park for an operator's Retry
or Discard), and an SMTP sink (``aiosmtpd``) that accepts every message. Both print what
they received.

Their ports follow central's, like the site demo's: 14 and 15 past it (8094 and 8095
for 8080), 15 and 14 below it when that would pass 65535, those of 8080 for a central
below 1024 or on port 0.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from email import message_from_bytes, policy
from typing import Any

import uvicorn
from aiosmtpd.smtp import SMTP, Envelope, Session
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from controlroom.site.demo import CHAT_WEBHOOK, ONCALL_LIST, PAGER_WEBHOOK

DEFAULT_CENTRAL_PORT = 8080
_PAST_CENTRAL = (14, 15)  # the webhook sink, the SMTP sink (the site demo has 11-13)
REFUSED_WEBHOOK = PAGER_WEBHOOK
"""The webhook the sink answers 500: its notifications retry, then park."""
DEMO_SECRET = "whsec_ZGVtby1vbmx5LW5vdC1hLXNlY3JldC0xMjM0"
"""The demo webhooks' signing secret (loopback only; a demo's, never a real one)."""

Printer = Callable[[str], None]


def sink_ports(central_port: int) -> tuple[int, int]:
    """The ports of the webhook sink and the SMTP sink for a central on
    ``central_port`` (see the module's docstring)."""
    if central_port < 1024:
        central_port = DEFAULT_CENTRAL_PORT
    if central_port + max(_PAST_CENTRAL) <= 65535:
        hook, smtp = (central_port + offset for offset in _PAST_CENTRAL)
    else:
        hook, smtp = (central_port - offset for offset in reversed(_PAST_CENTRAL))
    return hook, smtp


def demo_notification_settings(central_port: int, host: str = "127.0.0.1") -> dict[str, Any]:
    """The ``notifications`` settings of the demo's central (``CONTROLROOM_NOTIFICATIONS``):
    the two sinks as channels, and rules on the events the demo raises (its failed
    import; the retries an operator starts). Three attempts park a notification."""
    hook_port, smtp_port = sink_ports(central_port)

    def webhook(name: str, **extra: str) -> dict[str, str]:
        url = f"http://{host}:{hook_port}/{name}"
        return {"name": name, "url": url, "secret": DEMO_SECRET, **extra}

    def rule(
        name: str, event: str, channel: str, target: str, window: str, severity: str = "Error"
    ) -> dict[str, Any]:
        return {
            "name": name,
            "event_types": [event],
            "channel": channel,
            "target": target,
            "severity": severity,
            "window": window,
        }

    return {
        "smtp": {"host": host, "port": smtp_port, "sender": "controlroom@demo.invalid"},
        "recipient_lists": [{"name": ONCALL_LIST, "addresses": ["oncall@demo.invalid"]}],
        "webhooks": [webhook(CHAT_WEBHOOK, format="slack"), webhook(REFUSED_WEBHOOK)],
        "rules": [
            rule("failed-imports-mail", "MessageFailedToImport", "Email", ONCALL_LIST, "PT10S"),
            rule("failed-imports-chat", "MessageFailedToImport", "Webhook", CHAT_WEBHOOK, "PT10S"),
            rule(
                "failed-imports-pager", "MessageFailedToImport", "Webhook", REFUSED_WEBHOOK, "PT10S"
            ),
            rule(  # a finished retry is news, not an error
                "retries-chat", "RetryOperationCompleted", "Webhook", CHAT_WEBHOOK, "PT30S", "Info"
            ),
        ],
        "max_attempts": 3,
        "backoff_base": "PT2S",
        "backoff_cap": "PT10S",
        "dispatch_interval_seconds": 1.0,
    }


def webhook_app(say: Printer) -> Starlette:
    """The webhook sink: ``POST /{name}`` answers 204, or 500 for ``pager``; each request
    is printed (its ``webhook-id`` and subject or text)."""

    async def receive(request: Request) -> Response:
        name = request.path_params["name"]
        body = await request.body()
        try:
            parsed = json.loads(body)
            text = (parsed.get("subject") or parsed.get("text", "")).partition("\n")[0]
        except (ValueError, AttributeError):
            text = "(not JSON)"
        refused = name == REFUSED_WEBHOOK
        answer = "refused, 500" if refused else "accepted"
        say(f"webhook {name}: {request.headers.get('webhook-id')} {text!r} ({answer})")
        return Response(status_code=500 if refused else 204)

    return Starlette(routes=[Route("/{name}", receive, methods=["POST"])])


class MailPrinter:
    """The SMTP sink's ``aiosmtpd`` handler: accepts every message and prints it."""

    def __init__(self, say: Printer) -> None:
        self._say = say

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content if isinstance(envelope.content, bytes) else b""
        message = message_from_bytes(content, policy=policy.default)
        self._say(
            f"mail to {', '.join(envelope.rcpt_tos)}: {message['Message-ID']} "
            f"{message['Subject']!r}"
        )
        return "250 Message accepted"


async def run_sinks(central_port: int, say: Printer, host: str = "127.0.0.1") -> None:
    """Serve both sinks until SIGINT or SIGTERM (``uvicorn``'s handlers end it).

    Raises ``OSError`` when a port is taken."""
    hook_port, smtp_port = sink_ports(central_port)
    loop = asyncio.get_running_loop()
    smtp = await loop.create_server(lambda: SMTP(MailPrinter(say), hostname=host), host, smtp_port)
    config = uvicorn.Config(
        webhook_app(say), host=host, port=hook_port, log_level="warning", lifespan="off"
    )
    try:
        await uvicorn.Server(config).serve()
    finally:
        smtp.close()
        await smtp.wait_closed()
