"""The dispatcher against real receivers on loopback, on every provider: a webhook
verified with the standardwebhooks package, e-mail received by aiosmtpd, retries, park,
and an outcome never written to a vanished row."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from standardwebhooks import Webhook

from controlroom.config import Settings
from controlroom.db.engine import create_store_engine
from controlroom.db.migrate import upgrade_database
from controlroom.db.tables import notifications
from controlroom.db.transactions import begin_write
from controlroom.notifications.channels import SmtpSender, WebhookSender
from controlroom.notifications.dispatcher import Dispatcher
from controlroom.notifications.lifecycle import Attempt, Policy, Verdict, after_attempt
from controlroom.notifications.store import (
    UNKNOWN_TARGET_GRACE,
    ActionOutcome,
    Command,
    NewNotification,
    SendableTargets,
    act_on_parked,
    claim_due,
    enqueue,
    record_attempt,
)
from tests.notifications.receivers import MailSink, WebhookReceiver, smtp_server, webhook_receiver
from tests.servers import TEST_CLIENT_TIMEOUT

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OPS = SendableTargets(webhooks=frozenset({"ops"}), recipient_lists=frozenset(), smtp=False)


class Clock:
    """A clock the test moves: every due notification is due at once after ``advance``."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float = 3600) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with webhook_receiver() as hook:
        yield hook


@pytest.fixture
def mail() -> Iterator[tuple[MailSink, int]]:
    with smtp_server() as sink:
        yield sink


def outbox_settings(
    database_url: str, receiver: WebhookReceiver, smtp_port: int, **extra: Any
) -> Settings:
    return Settings(
        database_url=database_url,
        notifications={
            "webhooks": [{"name": "ops", "url": receiver.url, "secret": SECRET}],
            "smtp": {"host": "127.0.0.1", "port": smtp_port, "sender": "cr@example.org"},
            "recipient_lists": [
                {"name": "oncall", "addresses": ["a@example.org", "b@example.org"]}
            ],
            "max_attempts": 3,
            **extra,
        },
    )


def put(engine: sa.Engine, now: datetime, **fields: Any) -> str:
    values: dict[str, Any] = {
        "source": "rule:test",
        "channel": "Webhook",
        "target": "ops",
        "subject": "Intake stalled",
        "body": "nothing stored for 60 s",
    }
    values.update(fields)
    with begin_write(engine) as conn:
        return enqueue(conn, NewNotification(**values), now=now).notification_id


def row(engine: sa.Engine, notification_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(notifications).where(notifications.c.notification_id == notification_id)
        ).one_or_none()


def dispatch(settings: Settings, engine: sa.Engine, clock: Clock) -> int:
    async def go() -> int:
        async with httpx.AsyncClient(timeout=TEST_CLIENT_TIMEOUT) as client:
            outbox = settings.notifications
            dispatcher = Dispatcher(
                settings,
                engine,
                owner="test",
                senders={
                    "Webhook": WebhookSender(outbox, client, clock),
                    "Email": SmtpSender(outbox, TEST_CLIENT_TIMEOUT, clock),
                },
                clock=clock,
                rng=random.Random(3),
            )
            return await dispatcher.dispatch()

    return asyncio.run(go())


@pytest.fixture
def clock() -> Clock:
    return Clock()


@dataclass
class Outbox:
    """One test's outbox: its store, settings pointing at the real receivers on loopback
    (a webhook ``receiver``, an SMTP ``sink``) and the test's clock."""

    engine: sa.Engine
    settings: Settings
    receiver: WebhookReceiver
    sink: MailSink
    clock: Clock

    def put(self, **fields: Any) -> str:
        return put(self.engine, self.clock(), **fields)

    def dispatch(self) -> int:
        return dispatch(self.settings, self.engine, self.clock)

    def row(self, notification_id: str) -> Any:
        return row(self.engine, notification_id)


@pytest.fixture
def outbox(
    engine: sa.Engine,
    database_url: str,
    receiver: WebhookReceiver,
    mail: tuple[MailSink, int],
    clock: Clock,
) -> Outbox:
    sink, port = mail
    return Outbox(engine, outbox_settings(database_url, receiver, port), receiver, sink, clock)


def test_a_webhook_is_delivered_once_signed_so_standardwebhooks_verifies_it(outbox: Outbox) -> None:
    notification_id = outbox.put(subject="Ünïcode ✓")
    assert outbox.dispatch() == 1
    assert outbox.dispatch() == 0
    (request,) = outbox.receiver.requests
    payload = Webhook(SECRET).verify(request.body, request.headers)
    assert payload["notification_id"] == notification_id == request.headers["webhook-id"]
    assert payload["subject"] == "Ünïcode ✓"
    stored = outbox.row(notification_id)
    assert (stored.status, stored.reply_code, stored.retry_count) == ("Delivered", 204, 0)
    assert stored.terminal_at_utc == outbox.clock() and stored.claim_token is None


def test_the_log_names_a_webhook_by_its_origin_and_each_attempt(
    outbox: Outbox, caplog: pytest.LogCaptureFixture
) -> None:
    """httpx logs each request's URL at INFO; a webhook's path is often its secret."""
    notification_id = outbox.put()
    outbox.receiver.status = 500
    with caplog.at_level(logging.INFO):
        outbox.dispatch()
        retry_at = outbox.row(notification_id).next_attempt_at_utc
        outbox.receiver.status = 204
        outbox.clock.advance()
        outbox.dispatch()
    assert outbox.receiver.url not in caplog.text and "/hook" not in caplog.text
    origin = outbox.receiver.url.removesuffix("/hook")
    assert f"{origin} (webhook ops)" in caplog.text  # httpx's request lines
    attempts = [r.getMessage() for r in caplog.records if notification_id in r.getMessage()]
    at = retry_at.astimezone(UTC).isoformat(timespec="seconds")
    assert attempts == [
        f"notification {notification_id} (Webhook to ops): attempt 1 failed, retrying at {at}: "
        "HTTP 500",
        f"notification {notification_id} (Webhook to ops): attempt 2 delivered, now Delivered",
    ]


def test_the_log_line_of_the_attempt_that_parks_does_not_read_as_a_retry(
    outbox: Outbox, caplog: pytest.LogCaptureFixture
) -> None:
    notification_id = outbox.put()
    outbox.receiver.status = 500
    with caplog.at_level(logging.INFO):
        for _ in range(3):  # max_attempts
            outbox.dispatch()
            outbox.clock.advance()
    assert outbox.row(notification_id).status == "Parked"
    attempts = [r.getMessage() for r in caplog.records if notification_id in r.getMessage()]
    assert [line.split(": ", 1)[1].split(",")[0] for line in attempts] == [
        "attempt 1 failed",
        "attempt 2 failed",
        "attempt 3 failed",
    ]
    assert "retrying at" in attempts[1]
    assert attempts[2] == (
        f"notification {notification_id} (Webhook to ops): attempt 3 failed, now Parked: HTTP 500"
    )


def test_a_slack_format_webhook_gets_slack_text_signed_and_the_same_bytes_again(
    outbox: Outbox,
) -> None:
    outbox.settings.notifications.webhooks[0].format = "slack"
    notification_id = outbox.put(subject="<Intake> & stalled", severity="Error")
    outbox.receiver.status = 500
    outbox.dispatch()
    outbox.receiver.status = 200
    outbox.clock.advance()
    outbox.dispatch()
    first, second = outbox.receiver.requests
    assert first.body == second.body  # serialised once, identical on every attempt
    payload = Webhook(SECRET).verify(first.body, first.headers)  # before the clock moved
    assert set(payload) == {"text"}  # Slack's incoming-webhook shape
    assert payload["text"].startswith("*Error: &lt;Intake&gt; &amp; stalled*\n")
    assert "nothing stored for 60 s" in payload["text"]
    assert notification_id in payload["text"]
    assert outbox.row(notification_id).status == "Delivered"


def test_a_failing_receiver_makes_it_retrying_then_parked_with_the_same_bytes(
    outbox: Outbox,
) -> None:
    notification_id = outbox.put()
    outbox.receiver.status = 500
    outbox.dispatch()
    stored = outbox.row(notification_id)
    assert (stored.status, stored.retry_count, stored.last_error) == ("Retrying", 1, "HTTP 500")
    assert stored.next_attempt_at_utc > outbox.clock()
    assert outbox.dispatch() == 0  # not due yet
    for _ in range(2):
        outbox.clock.advance()
        outbox.dispatch()
    stored = outbox.row(notification_id)
    assert (stored.status, stored.retry_count, stored.next_attempt_at_utc) == ("Parked", 3, None)
    assert len(outbox.receiver.requests) == 3
    assert len({request.body for request in outbox.receiver.requests}) == 1  # serialised once
    assert len({request.headers["webhook-timestamp"] for request in outbox.receiver.requests}) == 3


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (302, {"location": "http://127.0.0.1:1/elsewhere"}, "Retrying"),
        (410, {}, "Parked"),
        (400, {}, "Failed"),
        (429, {"retry-after": "120"}, "Retrying"),
    ],
)
def test_the_webhook_etiquette(
    outbox: Outbox,
    status: int,
    headers: dict[str, str],
    expected: str,
) -> None:
    notification_id = outbox.put()
    outbox.receiver.status, outbox.receiver.headers = status, headers
    outbox.dispatch()
    stored = outbox.row(notification_id)
    assert (stored.status, stored.reply_code) == (expected, status)
    assert len(outbox.receiver.requests) == 1  # a redirect is never followed
    if status == 429:
        assert stored.next_attempt_at_utc == outbox.clock() + timedelta(seconds=120)


def test_an_unknown_target_fails_permanently(outbox: Outbox) -> None:
    notification_id = outbox.put(target="nobody")
    outbox.clock.advance(UNKNOWN_TARGET_GRACE.total_seconds())
    outbox.dispatch()
    stored = outbox.row(notification_id)
    assert (stored.status, stored.last_error) == ("Failed", "no webhook named 'nobody'")


def test_a_target_one_serve_does_not_know_waits_for_the_serve_that_does(
    engine: sa.Engine,
    database_url: str,
    receiver: WebhookReceiver,
    mail: tuple[MailSink, int],
    clock: Clock,
) -> None:
    """Breaker pass (sixth): two serves on one database, one of them without the webhook
    (a change of their settings rolling out): it claimed the other's notifications and
    failed them ("no webhook named 'hang'"). A dispatcher leaves what it cannot send to one
    that can, for ``UNKNOWN_TARGET_GRACE`` past its due time; e-mail too, where it has no
    SMTP server."""
    knowing = outbox_settings(database_url, receiver, mail[1])
    unknowing = Settings(database_url=database_url)  # no webhook, no SMTP server
    hook = put(engine, clock(), target="ops")
    mailed = put(engine, clock(), channel="Email", target="oncall")
    assert dispatch(unknowing, engine, clock) == 0
    assert {row(engine, hook).status, row(engine, mailed).status} == {"Pending"}
    clock.advance(UNKNOWN_TARGET_GRACE.total_seconds() - 1)
    assert dispatch(unknowing, engine, clock) == 0  # still within the grace
    assert dispatch(knowing, engine, clock) == 2
    assert {row(engine, hook).status, row(engine, mailed).status} == {"Delivered"}


def test_an_email_reaches_each_recipient_once_with_its_id(outbox: Outbox) -> None:
    subject = "Störung\r\nBcc: victim@example.org"
    notification_id = outbox.put(channel="Email", target="oncall", subject=subject)
    outbox.sink.refuse["b@example.org"] = "450 4.7.1 greylisted, try later"
    outbox.dispatch()
    stored = outbox.row(notification_id)
    assert (stored.status, stored.reply_code) == ("Retrying", 450)
    outbox.sink.refuse.clear()
    outbox.clock.advance()
    outbox.dispatch()
    assert outbox.row(notification_id).status == "Delivered"
    assert [m.recipients for m in outbox.sink.mails] == [["a@example.org"], ["b@example.org"]]
    for received in outbox.sink.mails:
        assert received.message["Message-ID"] == f"<{notification_id}@controlroom>"
        assert received.message["Subject"] == "Störung  Bcc: victim@example.org"
        assert received.message["Bcc"] is None
    raw = outbox.sink.mails[0].message.as_bytes(
        policy=outbox.sink.mails[0].message.policy.clone(utf8=False)
    )
    assert b"=?utf-8?" in raw.lower()


@pytest.mark.parametrize("line_break", ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c"])
def test_a_subject_with_a_unicode_line_break_is_delivered_on_one_line(
    outbox: Outbox,
    line_break: str,
) -> None:
    subject = f"Pump 3{line_break}Bcc: victim@example.org"
    notification_id = outbox.put(channel="Email", target="oncall", subject=subject)
    outbox.dispatch()
    assert outbox.row(notification_id).status == "Delivered"
    assert [m.recipients for m in outbox.sink.mails] == [["a@example.org", "b@example.org"]]
    for received in outbox.sink.mails:
        assert received.message["Subject"] == "Pump 3 Bcc: victim@example.org"
        assert received.message["Bcc"] is None


def test_a_5xx_for_every_recipient_fails_it(outbox: Outbox) -> None:
    notification_id = outbox.put(channel="Email", target="oncall")
    outbox.sink.refuse = {"a@example.org": "550 no such user", "b@example.org": "550 no such user"}
    outbox.dispatch()
    stored = outbox.row(notification_id)
    assert (stored.status, stored.reply_code) == ("Failed", 550)


def test_a_login_the_server_cannot_do_is_a_configuration_error_parked(outbox: Outbox) -> None:
    smtp = outbox.settings.notifications.smtp
    assert smtp is not None
    smtp.starttls = True  # the sink offers no STARTTLS: never fall back to plain text
    notification_id = outbox.put(channel="Email", target="oncall")
    outbox.dispatch()
    stored = outbox.row(notification_id)
    assert stored.status == "Parked" and outbox.sink.mails == []
    assert stored.last_error.startswith("SMTP")


def test_an_outcome_for_a_vanished_row_is_logged_and_not_written(
    engine: sa.Engine, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    notification_id = put(engine, clock())
    (claimed,) = claim_due(
        engine, now=clock(), limit=10, claim_for=timedelta(minutes=5), sendable=OPS
    )
    with begin_write(engine) as conn:
        conn.execute(sa.delete(notifications))  # the purge took it
    attempt = Attempt(Verdict.DELIVERED, reply_code=200)
    after = after_attempt(0, attempt, clock(), Policy(3, 1, 1, 1), random.Random())
    assert not record_attempt(engine, claimed, attempt, after, now=clock())
    assert row(engine, notification_id) is None
    assert "gone or claimed again" in caplog.text


def test_a_claimed_row_is_not_claimed_twice_until_its_claim_lapses(
    engine: sa.Engine, clock: Clock
) -> None:
    put(engine, clock())
    claim = timedelta(minutes=5)
    assert len(claim_due(engine, now=clock(), limit=10, claim_for=claim, sendable=OPS)) == 1
    assert claim_due(engine, now=clock(), limit=10, claim_for=claim, sendable=OPS) == []
    clock.advance(301)  # the dispatcher died mid-send: the row is due again, same id
    assert len(claim_due(engine, now=clock(), limit=10, claim_for=claim, sendable=OPS)) == 1


@pytest.mark.postgresql
def test_two_dispatchers_on_one_database_send_each_notification_once(
    postgresql_url: str, receiver: WebhookReceiver, mail: tuple[MailSink, int], clock: Clock
) -> None:
    engine = create_store_engine(postgresql_url)
    try:
        upgrade_database(engine)
        settings = outbox_settings(postgresql_url, receiver, mail[1], batch_size=20)
        ids = {put(engine, clock(), source_event_id=str(n)) for n in range(1000)}

        async def both() -> list[int]:
            async with httpx.AsyncClient(timeout=TEST_CLIENT_TIMEOUT) as client:
                outbox = settings.notifications
                senders = {"Webhook": WebhookSender(outbox, client, clock)}
                dispatchers = [
                    Dispatcher(settings, engine, owner=owner, senders=senders, clock=clock)
                    for owner in ("one", "two")
                ]
                return await asyncio.gather(*(each.dispatch() for each in dispatchers))

        # A run ends at a short claim (rows the other one holds are skipped): run until
        # nothing is due.
        shares = asyncio.run(both())
        while (more := asyncio.run(both())) != [0, 0]:
            shares = [a + b for a, b in zip(shares, more, strict=True)]
        received = [request.headers["webhook-id"] for request in receiver.requests]
        assert sorted(received) == sorted(ids)  # each once, none missing
        assert min(shares) > 0  # both took a share
        with engine.connect() as conn:
            statuses = conn.execute(sa.select(notifications.c.status).distinct()).scalars()
            assert list(statuses) == ["Delivered"]
    finally:
        engine.dispose()


def test_parked_then_retried_by_an_operator_is_delivered_when_the_receiver_recovers(
    outbox: Outbox,
) -> None:
    retried, discarded = outbox.put(), outbox.put(subject="second")
    outbox.receiver.status = 500
    for _ in range(3):
        outbox.dispatch()
        outbox.clock.advance()
    assert {outbox.row(retried).status, outbox.row(discarded).status} == {"Parked"}
    outbox.receiver.status = 200
    applied = act_on_parked(outbox.engine, retried, Command.RETRY, "olga", now=outbox.clock())
    ended = act_on_parked(outbox.engine, discarded, Command.DISCARD, "olga", now=outbox.clock())
    assert (applied.outcome, ended.outcome) == (ActionOutcome.APPLIED, ActionOutcome.APPLIED)
    assert outbox.dispatch() == 1
    assert (outbox.row(retried).status, outbox.row(discarded).status) == (
        "Delivered",
        "Discarded",
    )
    sent = [request.headers["webhook-id"] for request in outbox.receiver.requests]
    assert sent.count(retried) == 4 and sent.count(discarded) == 3
    bodies = {
        request.body
        for request in outbox.receiver.requests
        if request.headers["webhook-id"] == retried
    }
    assert len(bodies) == 1  # the operator's retry sends the same bytes


def test_the_dispatcher_backs_off_while_the_database_is_unreachable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(
        database_url="postgresql+psycopg://postgres@127.0.0.1:1/unreachable",
        notifications={"dispatch_interval_seconds": 0.1},
        ingestion={"max_backoff_seconds": 1.0},
    )
    engine = create_store_engine(settings.database_url)
    dispatcher = Dispatcher(settings, engine, owner="test", senders={}, rng=random.Random(3))
    failures = 4

    def failed_runs() -> list[float]:
        return [
            float(record.getMessage().split("next run in ")[1].split(" s")[0])
            for record in caplog.records
            if record.getMessage().startswith("notification dispatch failed")
        ]

    async def go() -> None:
        runner = asyncio.create_task(dispatcher.run())
        while len(failed_runs()) < failures:
            await asyncio.sleep(0.01)
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner

    try:
        with caplog.at_level("WARNING"):
            asyncio.run(go())
    finally:
        engine.dispose()
    delays = failed_runs()[:failures]
    assert delays[1] > delays[0] and delays[2] > delays[1]  # doubling, despite the jitter
    assert max(delays) <= 1.0 * 1.2  # capped by max_backoff_seconds, give or take the jitter


def test_an_email_to_explicit_addresses_mails_them_and_no_list(
    engine: sa.Engine,
    database_url: str,
    receiver: WebhookReceiver,
    mail: tuple[MailSink, int],
    clock: Clock,
) -> None:
    sink, port = mail
    settings = outbox_settings(database_url, receiver, port)
    addresses = ("x@plant.example", "y@plant.example")
    notification_id = put(
        engine, clock(), channel="Email", target="oncall", recipients=addresses, source="site:p7"
    )
    sink.refuse["y@plant.example"] = "450 4.7.1 greylisted, try later"
    dispatch(settings, engine, clock)
    assert row(engine, notification_id).status == "Retrying"
    sink.refuse.clear()
    clock.advance()
    dispatch(settings, engine, clock)
    assert row(engine, notification_id).status == "Delivered"
    assert [m.recipients for m in sink.mails] == [["x@plant.example"], ["y@plant.example"]]


@pytest.mark.parametrize("smtp", [True, False], ids=["smtp", "no-smtp"])
def test_an_unknown_target_of_either_channel_fails_once_naming_it(
    engine: sa.Engine,
    database_url: str,
    receiver: WebhookReceiver,
    mail: tuple[MailSink, int],
    clock: Clock,
    smtp: bool,
) -> None:
    sink, port = mail
    settings = outbox_settings(database_url, receiver, port)
    if not smtp:  # no mail server, so no recipient list either: every list is unknown
        settings = Settings(
            database_url=database_url,
            notifications={"webhooks": [{"name": "ops", "url": receiver.url, "secret": SECRET}]},
        )
    hook = put(engine, clock(), source="site:plant-7", target="no-such-hook")
    mailed = put(engine, clock(), source="site:plant-7", channel="Email", target="no-such-list")
    assert dispatch(settings, engine, clock) == 0  # left for a serve that knows them
    clock.advance(UNKNOWN_TARGET_GRACE.total_seconds())
    assert dispatch(settings, engine, clock) == 2
    assert (row(engine, hook).status, row(engine, hook).last_error) == (
        "Failed",
        "no webhook named 'no-such-hook'",
    )
    assert (row(engine, mailed).status, row(engine, mailed).last_error) == (
        "Failed",
        "no recipient list named 'no-such-list'",
    )
    assert row(engine, mailed).terminal_at_utc is not None
    clock.advance()
    assert dispatch(settings, engine, clock) == 0  # never tried again
    assert receiver.requests == [] and sink.mails == []


def test_a_hanging_send_holds_up_no_other_notification(
    engine: sa.Engine, database_url: str, mail: tuple[MailSink, int], clock: Clock
) -> None:
    """One webhook hangs on its first request; the other's notifications, three claims'
    worth, are all delivered while it hangs: its send holds its own slot, never a claim.
    The hanging receiver answers only once the test saw the others arrive (no timing)."""
    with webhook_receiver() as ops, webhook_receiver() as stuck:
        stuck.hang = True
        hooks = [
            {"name": "ops", "url": ops.url, "secret": SECRET},
            {"name": "stuck", "url": stuck.url, "secret": SECRET},
        ]
        settings = outbox_settings(
            database_url, ops, mail[1], webhooks=hooks, batch_size=4, concurrency=3,
            send_timeout=120, claim_seconds=600,
        )  # fmt: skip
        hanging = put(engine, clock() - timedelta(seconds=1), target="stuck")  # claimed first
        others = {put(engine, clock(), source_event_id=str(n)) for n in range(10)}

        async def go() -> int:
            async with httpx.AsyncClient(timeout=TEST_CLIENT_TIMEOUT) as client:
                outbox = settings.notifications
                dispatcher = Dispatcher(
                    settings,
                    engine,
                    owner="test",
                    senders={"Webhook": WebhookSender(outbox, client, clock)},
                    clock=clock,
                )
                running = asyncio.create_task(dispatcher.dispatch())
                async with asyncio.timeout(100):  # a guard against a hang, not a measure
                    while len(ops.requests) < len(others) or not stuck.requests:
                        await asyncio.sleep(0.01)
                # Every other notification arrived while the hanging send is still under
                # way: no outcome of it is written yet.
                still = await asyncio.to_thread(row, engine, hanging)
                assert (still.status, still.retry_count, still.claim_token is None) == (
                    "Pending",
                    0,
                    False,
                )
                stuck.release.set()
                return await running

        assert asyncio.run(go()) == 11
        assert {request.headers["webhook-id"] for request in ops.requests} == others
        assert [request.headers["webhook-id"] for request in stuck.requests] == [hanging]
        assert row(engine, hanging).status == "Delivered"
