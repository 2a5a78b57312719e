"""A running site agent: its HTTP API, its retry loop, its telemetry outbox, its
notifications' forwarder and their purge, together.

``run_site`` is what ``controlroom site serve`` runs; a site's own asyncio process can
run ``SiteService(agent).run(listener)`` beside its work. The loops do their blocking
store I/O in threads, so the API keeps answering while calls are attempted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from datetime import UTC, datetime

import uvicorn
from starlette.types import ASGIApp

from controlroom.exceptions import ConfigurationError
from controlroom.runtime.addresses import is_loopback
from controlroom.site.agent import SiteAgent
from controlroom.site.config import SiteSettings
from controlroom.site.outbox import NotificationForwarder, OutboxSender
from controlroom.site.server import create_site_app

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the caller owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def make_server(app: ASGIApp) -> uvicorn.Server:
    """A uvicorn server of ``app`` that leaves signals to its caller; ``serve(sockets=)``
    runs it, ``should_exit = True`` stops it."""
    return _Server(uvicorn.Config(app, lifespan="off", log_level="warning"))


def ensure_agent_is_protected(settings: SiteSettings) -> None:
    """Raises ``ConfigurationError`` for an agent without a token on a non-loopback
    address: anyone who could reach it could read its calls and retry or discard them."""
    if settings.token is None and not is_loopback(settings.host):
        raise ConfigurationError(
            f"refusing to serve the site agent on {settings.host} without a token "
            "(set CONTROLROOM_SITE_TOKEN, at least 16 characters) or bind to 127.0.0.1"
        )


class SiteService:
    """The agent's API, retry loop and (when ``central_url`` is set) the senders of its
    telemetry and its notifications."""

    def __init__(self, agent: SiteAgent) -> None:
        self.agent = agent
        self.server = make_server(create_site_app(agent))

    async def run(self, listener: socket.socket) -> None:
        """Serve on ``listener`` (made by ``runtime.sockets.listen``, so accepted
        connections get ``TCP_NODELAY``) and run the loops until cancelled or ``stop()``."""
        tasks = [
            asyncio.create_task(self.server.serve(sockets=[listener]), name="site api"),
            asyncio.create_task(self._retry_loop(), name="site retries"),
            asyncio.create_task(self._purge_loop(), name="site notification purge"),
        ]
        senders: list[OutboxSender | NotificationForwarder] = []
        if self.agent.settings.central_url:
            senders = [
                OutboxSender(self.agent.store, self.agent.settings),
                NotificationForwarder(self.agent.store, self.agent.settings),
            ]
            for sender in senders:
                tasks.append(asyncio.create_task(sender.run(), name=f"site {sender.what}"))
        try:
            await tasks[0]  # the server ends on stop(); the loops run until then
        finally:
            for task in tasks[1:]:
                task.cancel()
            await asyncio.gather(*tasks[1:], return_exceptions=True)
            for sender in senders:
                sender.close()

    def stop(self) -> None:
        self.server.should_exit = True

    async def _purge_loop(self) -> None:
        """Purge settled notifications (``SiteAgent.purge_notifications``) at start and
        every ``notification_purge_interval``; a failure is logged and the next round
        tries again."""
        interval = self.agent.settings.notification_purge_interval
        while True:
            try:
                purged = await asyncio.to_thread(self.agent.purge_notifications)
            except Exception:
                log.warning("purging settled notifications failed", exc_info=True)
            else:
                if purged:
                    log.info("purged %d settled notifications", purged)
            await asyncio.sleep(interval)

    async def _retry_loop(self) -> None:
        """Attempt due calls; sleep until the next falls due, at most ``retry_poll`` (a
        Retry command or a new buffered call is picked up within that)."""
        poll = self.agent.settings.retry_poll
        while True:
            try:
                attempted = await asyncio.to_thread(self.agent.attempt_due)
                if attempted:
                    continue
                due = await asyncio.to_thread(self.agent.next_due_at)
            except Exception:
                log.warning("retry loop failed; trying again in %.0f s", poll, exc_info=True)
                due = None
            wait = poll if due is None else (due - datetime.now(UTC)).total_seconds()
            await asyncio.sleep(min(poll, max(0.0, wait)))
