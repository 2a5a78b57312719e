"""A site's notifications: stored at the agent before it answers, refused whole when too
long, forwarded to central once it is up (its own token), and a notification central
refuses for good kept at the site as Rejected with the reason, and a batch central took
but the site never marked stored once at central."""

from __future__ import annotations

import json
import socket
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from controlroom.config import ConfiguredSite
from controlroom.db.tables import notifications
from controlroom.runtime.sockets import listen
from controlroom.site import SiteAgent, SiteSettings
from controlroom.site.outbox import CentralUnavailable, NotificationForwarder
from controlroom.site.store import NotificationStatus
from tests.reconciliation.harness import (
    SITE_TOKEN,
    central_settings,
    central_token_of,
    eventually,
    running_agent,
    running_central,
    site_entry,
)
from tests.servers import TEST_CLIENT_TIMEOUT
from tests.site.http import serving

AUTH = {"Authorization": f"Bearer {SITE_TOKEN}"}


def settings(tmp_path: Path, **overrides: object) -> SiteSettings:
    values: dict[str, object] = {
        "site_id": "plant-7",
        "store_path": tmp_path / "site" / "tracking.db",
        "token": SITE_TOKEN,
    }
    return SiteSettings(**{**values, **overrides})


def central_notifications(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(notifications)).all())


def test_notify_stores_a_pending_notification_and_refuses_an_over_long_one(
    tmp_path: Path,
) -> None:
    agent = SiteAgent(settings(tmp_path))
    try:
        notification_id = agent.notify("oncall", "Pump 3 stopped", "at 08:00", severity="Error")
        assert str(uuid.UUID(notification_id)) == notification_id
        for field, call in [
            ("subject", lambda: agent.notify("oncall", "s" * 257)),
            ("target", lambda: agent.notify("t" * 257, "Pump")),
            ("channel", lambda: agent.notify("oncall", "Pump", channel="Pager")),
        ]:
            with pytest.raises(ValueError, match=rf"^{field}: "):
                call()
        (row,) = agent.store.notifications(None, 10)
        assert (row["notification_id"], row["status"], row["severity"]) == (
            notification_id,
            "Pending",
            "Error",
        )
        again = agent.notify("oncall", "Pump 3 stopped", notification_id=notification_id)
        assert again == notification_id and len(agent.store.notifications(None, 10)) == 1
    finally:
        agent.close()


def test_the_http_api_stores_before_answering_and_names_the_field_it_refuses(
    tmp_path: Path,
) -> None:
    with running_agent(settings(tmp_path)) as agent:
        url = f"{agent.url}/site/notifications"
        for field, body in [
            ("subject", {"target": "oncall", "subject": "s" * 257}),
            ("target", {"target": "t" * 257, "subject": "Pump"}),
        ]:
            refused = httpx.post(url, json=body, headers=AUTH, timeout=TEST_CLIENT_TIMEOUT)
            assert refused.status_code == 422
            assert [e["loc"] for e in refused.json()["detail"]] == [["body", field]]
        answer = httpx.post(
            url,
            json={"target": "ops-hook", "subject": "Pump", "channel": "Webhook"},
            headers=AUTH,
            timeout=TEST_CLIENT_TIMEOUT,
        )
        assert answer.status_code == 201
        notification_id = answer.json()["notification_id"]
        # Committed before the answer: the store has it now.
        assert agent.store.notification(notification_id)["status"] == "Pending"
        listed = httpx.get(url, headers=AUTH, timeout=TEST_CLIENT_TIMEOUT).json()["items"]
        assert [(i["notification_id"], i["channel"]) for i in listed] == [
            (notification_id, "Webhook")
        ]
        assert httpx.get(url, timeout=TEST_CLIENT_TIMEOUT).status_code == 401


def test_notifications_reach_central_once_it_is_up_and_a_refused_one_stays_rejected(
    database_url: str, tmp_path: Path
) -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    agent_settings = settings(
        tmp_path, central_url=f"http://127.0.0.1:{port}", central_token=central_token_of("plant-7"),
        outbox_poll=0.05, outbox_backoff_cap=0.2,
    )  # fmt: skip
    with running_agent(agent_settings) as agent:
        sent = [agent.notify("oncall", f"Pump {n} stopped") for n in range(3)]
        # A row the agent's own checks never let in (an older agent's, say): central
        # refuses it for good, naming the field.
        bad = str(uuid.uuid4())
        agent.store.add_notification(
            {
                "notification_id": bad,
                "channel": "Email",
                "target": "oncall",
                "subject": "s" * 300,
                "body": "",
                "severity": "Info",
            },
            datetime.now(UTC),
        )
        assert len(agent.store.pending_notifications(10)) == 4  # central is down
        sites = [site_entry("plant-7", "http://127.0.0.1:9")]
        settings_ = central_settings(database_url, tmp_path / "central", sites)
        with running_central(settings_, listen("127.0.0.1", port)) as (_url, _app, engine):
            eventually(lambda: not agent.store.pending_notifications(10), what="forwarded")
            rows = central_notifications(engine)
            assert sorted(r.notification_id for r in rows) == sorted(sent)
            assert {r.source for r in rows} == {"site:plant-7"}
            rejected = httpx.get(
                f"{agent.url}/site/notifications",
                params={"status": "Rejected"},
                headers=AUTH,
                timeout=TEST_CLIENT_TIMEOUT,
            ).json()["items"]
            assert [(r["notification_id"], r["rejected_reason"]) for r in rejected] == [
                (bad, "subject: 300 characters; at most 256")
            ]
            forwarded = agent.store.notifications(NotificationStatus.FORWARDED, 10)
            assert sorted(r["notification_id"] for r in forwarded) == sorted(sent)


def test_a_batch_central_took_but_the_site_never_marked_is_sent_again_and_stored_once(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sites = [site_entry("plant-7", "http://127.0.0.1:9")]
    settings_ = central_settings(database_url, tmp_path / "central", sites)
    with running_central(settings_) as (url, _app, engine):
        agent = SiteAgent(
            settings(tmp_path, central_url=url, central_token=central_token_of("plant-7"))
        )
        forwarder = NotificationForwarder(agent.store, agent.settings)
        try:
            sent = agent.notify("oncall", "Pump 3 stopped")

            def dies(*_args: object) -> None:
                raise RuntimeError("killed before it marked the batch")

            # Central answers 2xx; the agent dies before its mark commits.
            monkeypatch.setattr(agent.store, "settle_notifications", dies)
            with pytest.raises(RuntimeError):
                forwarder.deliver_once()
            monkeypatch.undo()
            assert agent.store.notification(sent)["status"] == "Pending"
            assert forwarder.deliver_once() == 1
            assert agent.store.notification(sent)["status"] == "Forwarded"
            assert [r.notification_id for r in central_notifications(engine)] == [sent]
        finally:
            forwarder.close()
            agent.close()


def refusing_central() -> FastAPI:
    """A central that refuses a whole request holding a notification titled "poison"."""
    app = FastAPI()

    @app.post("/api/site-notifications")
    def intake(items: list[dict[str, Any]]) -> JSONResponse:
        if any(item["subject"] == "poison" for item in items):
            return JSONResponse({"detail": "the request is malformed"}, 400)
        return JSONResponse({"accepted": list(range(len(items))), "rejected": []})

    return app


def test_a_whole_batch_refused_is_sent_one_by_one_and_only_the_culprit_kept_rejected(
    tmp_path: Path,
) -> None:
    with serving(refusing_central()) as url:
        agent = SiteAgent(settings(tmp_path, central_url=url))
        forwarder = NotificationForwarder(agent.store, agent.settings)
        try:
            good = agent.notify("oncall", "Pump 3 stopped")
            poison = agent.notify("oncall", "poison")
            assert forwarder.deliver_once() == 2
            assert agent.store.notification(good)["status"] == "Forwarded"
            refused = agent.store.notification(poison)
            assert (refused["status"], refused["rejected_reason"]) == (
                "Rejected",
                'central answered 400: {"detail":"the request is malformed"}',
            )
            assert forwarder.deliver_once() == 0  # nothing is sent again
        finally:
            forwarder.close()
            agent.close()


def test_a_central_without_the_intake_keeps_them_pending(tmp_path: Path) -> None:
    with serving(FastAPI()) as url:  # every path answers 404
        agent = SiteAgent(settings(tmp_path, central_url=url))
        forwarder = NotificationForwarder(agent.store, agent.settings)
        try:
            sent = agent.notify("oncall", "Pump 3 stopped")
            with pytest.raises(CentralUnavailable, match="404"):
                forwarder.deliver_once()
            assert agent.store.notification(sent)["status"] == "Pending"
        finally:
            forwarder.close()
            agent.close()


def test_notify_to_explicit_addresses_stores_them_and_refuses_bad_ones_whole(
    tmp_path: Path,
) -> None:
    agent = SiteAgent(settings(tmp_path))
    try:
        addresses = ["ops@plant.example", "anna@plant.example"]
        notification_id = agent.notify(None, "Pump 3 stopped", recipients=addresses)
        stored = agent.store.notification(notification_id)
        assert stored is not None
        assert (stored["recipients"], stored["target"], stored["channel"]) == (
            addresses,
            "ops@plant.example, anna@plant.example",
            "Email",
        )
        assert agent.store.pending_notifications(10)[0]["recipients"] == addresses
        for call in [
            lambda: agent.notify(None, "Pump", recipients=["ops@plant.example\r\nBcc: x@y.z"]),
            lambda: agent.notify(None, "Pump", recipients=["ops@plant.example\nx@y.z"]),
            lambda: agent.notify(None, "Pump", recipients=["not an address"]),
            lambda: agent.notify(None, "Pump", recipients=["a@b.c, d@e.f"]),
            lambda: agent.notify(None, "Pump", recipients=["x" * 250 + "@b.example"]),
            lambda: agent.notify(None, "Pump", recipients=[f"u{n}@b.example" for n in range(51)]),
            lambda: agent.notify(None, "Pump", recipients=[]),
            lambda: agent.notify(None, "Pump", recipients=["a@b.example", "a@b.example"]),
            lambda: agent.notify("oncall", "Pump", recipients=["a@b.example"]),
            lambda: agent.notify(None, "Pump", recipients=["a@b.example"], channel="Webhook"),
        ]:
            with pytest.raises(ValueError, match=r"^recipients"):
                call()
        with pytest.raises(ValueError, match=r"^recipients: .*name a target or recipients"):
            agent.notify(None, "Pump")
        assert len(agent.store.notifications(None, 10)) == 1
    finally:
        agent.close()


def test_the_http_api_takes_explicit_addresses_and_names_a_bad_one(tmp_path: Path) -> None:
    with running_agent(settings(tmp_path)) as agent:
        url = f"{agent.url}/site/notifications"
        refused = httpx.post(
            url,
            json={"recipients": ["a@b.example\r\nBcc: c@d.example"], "subject": "Pump"},
            headers=AUTH,
            timeout=TEST_CLIENT_TIMEOUT,
        )
        assert refused.status_code == 422
        assert refused.json()["detail"][0]["loc"][:2] == ["body", "recipients"]
        answer = httpx.post(
            url,
            json={"recipients": ["a@b.example"], "subject": "Pump"},
            headers=AUTH,
            timeout=TEST_CLIENT_TIMEOUT,
        )
        assert answer.status_code == 201
        shown = httpx.get(
            f"{url}/{answer.json()['notification_id']}", headers=AUTH, timeout=TEST_CLIENT_TIMEOUT
        ).json()
        assert (shown["recipients"], shown["target"]) == (["a@b.example"], "a@b.example")


def test_explicit_addresses_reach_central_in_the_sites_domains_and_others_stay_rejected(
    database_url: str, tmp_path: Path
) -> None:
    site = ConfiguredSite.model_validate(
        site_entry("plant-7", "http://127.0.0.1:9").model_dump()
        | {"recipient_domains": ["plant.example"]}
    )
    settings_ = central_settings(database_url, tmp_path / "central", [site])
    with running_central(settings_) as (url, _app, engine):
        agent = SiteAgent(
            settings(tmp_path, central_url=url, central_token=central_token_of("plant-7"))
        )
        forwarder = NotificationForwarder(agent.store, agent.settings)
        try:
            inside = agent.notify(None, "Pump", recipients=["ops@plant.example", "a@PLANT.example"])
            outside = agent.notify(None, "Pump", recipients=["ops@plant.example", "x@evil.example"])
            assert forwarder.deliver_once() == 2
            assert agent.store.notification(inside)["status"] == "Forwarded"
            refused = agent.store.notification(outside)
            assert refused["status"] == "Rejected"
            assert "x@evil.example" in refused["rejected_reason"]
            assert "recipient_domains" in refused["rejected_reason"]
            (row,) = central_notifications(engine)
            assert row.notification_id == inside
            assert json.loads(row.recipients) == ["ops@plant.example", "a@PLANT.example"]
        finally:
            forwarder.close()
            agent.close()


def test_notifications_central_settled_are_purged_after_the_retention_pending_never(
    tmp_path: Path,
) -> None:
    now = [datetime(2026, 3, 1, 12, 0, tzinfo=UTC)]
    agent = SiteAgent(settings(tmp_path), clock=lambda: now[0])
    try:
        forwarded = agent.notify("oncall", "Pump 1 stopped")
        rejected = agent.notify("oncall", "Pump 2 stopped")
        pending = agent.notify("oncall", "Pump 3 stopped")  # central never took it
        settled_at = now[0] + timedelta(hours=1)
        agent.store.settle_notifications([forwarded], {rejected: "refused"}, settled_at)
        now[0] = settled_at + timedelta(days=7)
        assert agent.purge_notifications() == 0  # seven days old: kept
        now[0] += timedelta(seconds=1)
        assert agent.purge_notifications() == 2
        assert [r["notification_id"] for r in agent.store.notifications(None, 10)] == [pending]
        now[0] += timedelta(days=365)
        assert agent.purge_notifications() == 0
        assert agent.store.notification(pending)["status"] == "Pending"
    finally:
        agent.close()


def test_the_running_agent_purges_on_its_own(tmp_path: Path) -> None:
    agent_settings = settings(
        tmp_path, notification_retention_days=1e-6, notification_purge_interval=0.05
    )  # a tenth of a second
    with running_agent(agent_settings) as agent:
        sent = agent.notify("oncall", "Pump 3 stopped")
        kept = agent.notify("oncall", "Pump 4 stopped")
        agent.store.settle_notifications([sent], {}, datetime.now(UTC))
        eventually(lambda: agent.store.notification(sent) is None, what="purged")
        assert agent.store.notification(kept)["status"] == "Pending"
