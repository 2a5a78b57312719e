"""The notification outbox end to end, on every provider: ``serve`` (the composition root,
with its worker, its intake and its dispatcher), a site agent posting to it over HTTP, a
real SMTP server (``aiosmtpd``) and real HTTP receivers, the signatures verified with
the ``standardwebhooks`` package (docs/design.md "Notification outbox").

(a) A site's notification (site agent -> central) and a rule's (a failed message ingested
-> ``FailureGroupAppeared`` -> the rule) are each delivered once, with their ids and a
valid signature; (b) a receiver answering 500 makes a notification Retrying, then Parked
after ``max_attempts``; an operator's Retry through the HTTP API makes it Delivered once
the receiver recovers, and Discard through the API ends another. Waits are on
conditions, each bounded only against a hang."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from standardwebhooks import Webhook

from controlroom import server
from controlroom.config import Settings
from controlroom.runtime.sockets import listen
from controlroom.site import SiteSettings
from controlroom.transport import create_transport
from tests.notifications.receivers import Received, smtp_server, webhook_receiver
from tests.nsb import failed_headers
from tests.reconciliation.harness import (
    OPERATOR,
    OPERATOR_TOKEN,
    READER_TOKEN,
    SITE_TOKEN,
    central_token_of,
    eventually,
    running_agent,
    site_entry,
)
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.site.http import url_of

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
FLAKY_SECRET = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"


@contextlib.contextmanager
def running_serve(settings: Settings, listener: Any) -> Iterator[str]:
    """``controlroom serve``'s ``server.run`` on ``listener``, in a thread of its own
    until the block ends; yields its base URL once every part has started."""
    seen: list[server.Serving] = []
    started: dict[str, Any] = {}

    async def main() -> None:
        stop = asyncio.Event()
        started["stop"] = (asyncio.get_running_loop(), stop)
        await server.run(settings, listener=listener, stop=stop, on_serving=seen.append)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    try:
        eventually(lambda: seen or not thread.is_alive(), what="serve started")
        assert seen, "serve stopped at start"
        yield seen[0].url
    finally:
        if "stop" in started:
            loop, stop = started["stop"]
            loop.call_soon_threadsafe(stop.set)
        thread.join(60)


async def publish_failure(settings: Settings, message_id: str) -> None:
    transport = create_transport(settings)
    await transport.start()
    try:
        headers = failed_headers(message_id, failed_at=datetime.now(UTC))
        await transport.publish(settings.error_queue, headers, b'{"order": 1}')
    finally:
        await transport.close()


def test_site_and_rule_notifications_delivered_and_a_parked_one_retried_or_discarded_by_api(
    database_url: str, tmp_path: Path
) -> None:
    with (
        webhook_receiver() as ops,
        webhook_receiver() as flaky,
        smtp_server() as (sink, smtp_port),
        listen("127.0.0.1", 0) as central_listener,
    ):
        agent_settings = SiteSettings(
            site_id="plant-7",
            store_path=tmp_path / "site" / "tracking.db",
            token=SITE_TOKEN,
            central_url=url_of(central_listener),
            central_token=central_token_of("plant-7"),
            outbox_poll=0.05,
            outbox_backoff_cap=0.2,
        )
        with running_agent(agent_settings) as agent:
            settings = Settings(
                data_dir=tmp_path / "central",
                database_url=database_url,
                auth_tokens=[
                    {"name": "alice", "token": OPERATOR_TOKEN, "role": "operator"},
                    {"name": "rita", "token": READER_TOKEN, "role": "reader"},
                ],
                sites=[site_entry("plant-7", agent.url)],
                notifications={
                    "webhooks": [
                        {"name": "ops", "url": ops.url, "secret": SECRET},
                        {"name": "flaky", "url": flaky.url, "secret": FLAKY_SECRET},
                    ],
                    "smtp": {"host": "127.0.0.1", "port": smtp_port, "sender": "cr@example.org"},
                    "recipient_lists": [{"name": "oncall", "addresses": ["a@example.org"]}],
                    "rules": [
                        {
                            "name": "new-failures",
                            "event_types": ["FailureGroupAppeared"],
                            "channel": "Webhook",
                            "target": "ops",
                            "window": "PT2S",
                        }
                    ],
                    "max_attempts": 3,
                    "backoff_base": 0.1,
                    "backoff_cap": 0.2,
                    "dispatch_interval_seconds": 0.1,
                    "send_timeout": 20,
                    "claim_seconds": 21,
                },
            )
            # The flaky receiver answers 500; each notification's second attempt waits
            # until the test has seen it Retrying through the API.
            flaky.status = 500
            seen_retrying = threading.Event()

            def second_attempt_waits(request: Received) -> None:
                with flaky.lock:
                    attempts = [r.headers["webhook-id"] for r in flaky.requests]
                if attempts.count(request.headers["webhook-id"]) == 2:
                    seen_retrying.wait(timeout=60)

            flaky.gate = second_attempt_waits
            with (
                running_serve(settings, central_listener) as url,
                httpx.Client(base_url=url, headers=OPERATOR, timeout=TEST_CLIENT_TIMEOUT) as api,
            ):

                def status(notification_id: str) -> Any:
                    answer = api.get(f"/api/notifications/{notification_id}")
                    return answer.json() if answer.status_code == 200 else None

                def has_status(notification_id: str, wanted: str) -> Any:
                    shown = status(notification_id)
                    return shown if shown and shown["status"] == wanted else None

                # (a) A site's notifications, by webhook and by e-mail, and a rule's.
                hooked = agent.notify("ops", "Pump 3 stopped", "at 08:00", channel="Webhook")
                mailed = agent.notify("oncall", "Pump 4 stopped", "at 08:01", severity="Error")
                asyncio.run(publish_failure(settings, "e2e-failure-1"))
                # (b) Two notifications to the receiver that fails.
                retried = agent.notify("flaky", "Valve 9 stuck", channel="Webhook")
                discarded = agent.notify("flaky", "Valve 10 stuck", channel="Webhook")

                for each in (retried, discarded):
                    shown = eventually(lambda each=each: has_status(each, "Retrying"))
                    assert (shown["retry_count"], shown["last_error"]) == (1, "HTTP 500")
                seen_retrying.set()
                for each in (retried, discarded):
                    shown = eventually(lambda each=each: has_status(each, "Parked"))
                    assert shown["retry_count"] == 3
                flaky.status = 204  # the receiver recovers
                assert api.post(f"/api/notifications/{retried}/retry").json()["outcome"] == (
                    "Applied"
                )
                ended = api.post(f"/api/notifications/{discarded}/discard")
                assert (ended.status_code, ended.json()["status"]) == (200, "Discarded")
                eventually(lambda: has_status(retried, "Delivered"))

                eventually(lambda: has_status(hooked, "Delivered"))
                eventually(lambda: has_status(mailed, "Delivered"))
                rule_rows = eventually(
                    lambda: [
                        item
                        for item in api.get("/api/notifications").json()["items"]
                        if item["source"] == "rule:new-failures" and item["status"] == "Delivered"
                    ],
                    what="the rule's notification delivered",
                )
                assert has_status(discarded, "Discarded")  # never sent again

    # Each once, with its id and a valid signature.
    (rule_row,) = rule_rows
    to_ops = Counter(request.headers["webhook-id"] for request in ops.requests)
    assert to_ops == {hooked: 1, rule_row["notification_id"]: 1}
    for request in ops.requests:
        payload = Webhook(SECRET).verify(request.body, request.headers)
        assert payload["notification_id"] == request.headers["webhook-id"]
        assert payload["source"] == ("site:plant-7" if payload["notification_id"] == hooked
                                     else "rule:new-failures")  # fmt: skip
    (mail,) = sink.mails
    assert mail.message["Message-ID"] == f"<{mailed}@controlroom>"
    assert (mail.recipients, mail.message["Subject"]) == (["a@example.org"], "Pump 4 stopped")
    to_flaky = Counter(request.headers["webhook-id"] for request in flaky.requests)
    assert to_flaky == {retried: 4, discarded: 3}  # 3 failed attempts; Retry's one delivered
    for request in flaky.requests:
        assert Webhook(FLAKY_SECRET).verify(request.body, request.headers)
