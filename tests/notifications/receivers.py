"""Real receivers on loopback for the outbox's tests: an HTTP server that records each
request and answers what the test scripts, and an SMTP server (``aiosmtpd``) that records
each message and may refuse recipients."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class WebhookReceiver:
    """Records every POST; answers ``status`` (with ``headers``) to each. While ``hang``
    is set, a request is recorded and then held unanswered until ``release`` is set.
    ``gate``, when set, is called with each request once it is recorded, on the
    server's thread, before the answer: it may hold the request (wait for the test)."""

    url: str
    status: int = 204
    headers: dict[str, str] = field(default_factory=dict)
    requests: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hang: bool = False
    release: threading.Event = field(default_factory=threading.Event)
    gate: Callable[[Received], None] | None = None


@contextmanager
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            received = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            with receiver.lock:
                receiver.requests.append(received)
                gate = receiver.gate
            if gate is not None:
                gate(received)
            with receiver.lock:
                status, headers = receiver.status, dict(receiver.headers)
                hang = receiver.hang
            if hang:
                receiver.release.wait(timeout=120)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # dispatchers connect many at once

    server = Server(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.release.set()
        server.shutdown()
        server.server_close()
        thread.join()


@dataclass
class Mail:
    sender: str
    recipients: list[str]
    message: EmailMessage


class MailSink:
    """An ``aiosmtpd`` handler: records each message; ``refuse`` maps an address to the
    reply its RCPT gets (e.g. ``"450 greylisted"``)."""

    def __init__(self) -> None:
        self.mails: list[Mail] = []
        self.refuse: dict[str, str] = {}

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if address in self.refuse:
            return self.refuse[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content
        assert isinstance(content, bytes)
        message = message_from_bytes(content, policy=policy.default)
        assert isinstance(message, EmailMessage)
        self.mails.append(Mail(str(envelope.mail_from), list(envelope.rcpt_tos), message))
        return "250 Message accepted"


@contextmanager
def smtp_server() -> Iterator[tuple[MailSink, int]]:
    sink = MailSink()
    with socket.socket() as probe:  # a free port: aiosmtpd checks its server by connecting
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield sink, port
    finally:
        controller.stop()
