"""The console's Notifications pages on every provider: the list with its status filter
and KPI tiles, the channels without secrets, and Retry/Discard by post/redirect/get (a
reload sends nothing); a reader sees no buttons and is refused."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from controlroom.app import create_app
from controlroom.config import AuthToken, Settings
from controlroom.db.tables import audit_log, notifications
from controlroom.db.transactions import begin_write
from controlroom.errors.ingest.bodies import FileSystemBodyStore
from controlroom.notifications.history import take_sample
from controlroom.notifications.store import keep_rejected
from tests.notifications.test_api import NOW, put
from tests.web.test_console_http import csrf_of

OPERATOR = "operator-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture
def console(tmp_path: Path, database_url: str, engine: sa.Engine) -> Iterator[TestClient]:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        auth_tokens=[
            AuthToken(name="olga", token=OPERATOR, role="operator"),
            AuthToken(name="rita", token=READER, role="reader"),
        ],
        notifications={
            "webhooks": [{"name": "ops", "url": "http://hooks.local/x", "secret": SECRET}]
        },
    )
    app = create_app(settings, engine, FileSystemBodyStore(tmp_path / "bodies"))
    with TestClient(app, follow_redirects=False) as client:
        yield client


def audit_count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(audit_log)).scalar_one()


def test_the_list_filters_by_status_and_shows_channels_without_secrets(
    console: TestClient, engine: sa.Engine
) -> None:
    console.post("/signin", data={"token": READER})
    put(engine, subject="parked one")
    put(engine, status="Delivered", subject="delivered one")
    page = console.get("/notifications", params={"status": "Parked"})
    assert page.status_code == 200
    assert "parked one" in page.text and "delivered one" not in page.text
    assert "hooks.local" in page.text and "whsec_" not in page.text
    assert console.get("/notifications", params={"status": "Nope"}).status_code == 400


def test_retry_by_post_redirect_get_and_a_reload_sends_nothing(
    console: TestClient, engine: sa.Engine
) -> None:
    console.post("/signin", data={"token": OPERATOR})
    notification_id = put(engine)
    page = console.get(f"/notifications/{notification_id}")
    assert 'action="/notifications/' in page.text and ">Retry<" in page.text
    answer = console.post(
        f"/notifications/{notification_id}/retry", data={"csrf_token": csrf_of(page.text)}
    )
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/notifications/{notification_id}"  # no outcome
    shown = console.get(answer.headers["location"])
    assert 'data-testid="flash-code">Applied<' in shown.text and "Retry" in shown.text
    assert ">Pending<" in shown.text and ">Retry<" not in shown.text
    reload = console.get(answer.headers["location"])  # a GET, shows the outcome once
    assert reload.status_code == 200 and 'data-testid="flash' not in reload.text
    assert audit_count(engine) == 1


def test_after_an_operators_retry_the_list_and_the_api_say_pending_until_an_attempt(
    console: TestClient, engine: sa.Engine
) -> None:
    """An operator's Retry puts a Parked notification back to Pending with its attempts
    counted afresh (docs/design.md "Notification outbox"); no dispatcher runs here, so
    nothing has been attempted and nothing may say Retrying."""
    console.post("/signin", data={"token": OPERATOR})
    notification_id = put(engine, subject="parked one")
    page = console.get(f"/notifications/{notification_id}")
    answer = console.post(
        f"/notifications/{notification_id}/retry", data={"csrf_token": csrf_of(page.text)}
    )
    assert answer.status_code == 303

    listed = console.get("/notifications").text
    row = listed.split('data-testid="subject">parked one<', 1)[0].rsplit("<tr>", 1)[1]
    assert 'data-testid="status">Pending<' in row and "Retrying" not in row
    assert "parked one" in console.get("/notifications", params={"status": "Pending"}).text
    assert "parked one" not in console.get("/notifications", params={"status": "Retrying"}).text
    shown = console.get(f"/notifications/{notification_id}").text
    assert ">Pending<" in shown and "Retrying" not in shown
    bearer = {"Authorization": f"Bearer {OPERATOR}"}
    (item,) = console.get("/api/notifications", headers=bearer).json()["items"]
    assert (item["status"], item["retry_count"]) == ("Pending", 0)
    retrying = console.get("/api/notifications", params={"status": "Retrying"}, headers=bearer)
    assert retrying.json()["items"] == []


def test_an_outcome_in_a_link_shows_nothing(console: TestClient, engine: sa.Engine) -> None:
    console.post("/signin", data={"token": READER})
    notification_id = put(engine)
    crafted = console.get(
        f"/notifications/{notification_id}", params={"outcome": "Applied", "command": "discard"}
    )
    assert crafted.status_code == 200
    assert "Applied" not in crafted.text and 'data-testid="flash' not in crafted.text


def test_discard_of_a_purged_notification_says_not_found(
    console: TestClient, engine: sa.Engine
) -> None:
    console.post("/signin", data={"token": OPERATOR})
    page = console.get("/notifications")
    unknown = "00000000-0000-4000-8000-000000000000"
    answer = console.post(
        f"/notifications/{unknown}/discard", data={"csrf_token": csrf_of(page.text)}
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/notifications"
    shown = console.get("/notifications")
    assert 'data-testid="flash-code">NotFound<' in shown.text and unknown in shown.text
    assert 'data-testid="flash' not in console.get("/notifications").text  # a reload
    assert audit_count(engine) == 0


def test_a_reader_sees_no_buttons_and_is_refused(console: TestClient, engine: sa.Engine) -> None:
    console.post("/signin", data={"token": READER})
    notification_id = put(engine)
    page = console.get(f"/notifications/{notification_id}")
    assert ">Retry<" not in page.text and "an operator can retry" in page.text
    answer = console.post(
        f"/notifications/{notification_id}/retry", data={"csrf_token": csrf_of(page.text)}
    )
    assert answer.status_code == 403
    assert audit_count(engine) == 0


def test_the_dashboard_shows_the_notification_tiles(console: TestClient, engine: sa.Engine) -> None:
    console.post("/signin", data={"token": READER})
    put(engine)
    page = console.get("/")
    assert page.status_code == 200
    tile = page.text.split('data-testid="notification-parked"', 1)[1]
    assert '<span class="figure">1</span>' in tile.split("</a>", 1)[0]


def test_an_empty_list_of_rejected_notifications_says_so_in_english(console: TestClient) -> None:
    console.post("/signin", data={"token": READER})
    page = console.get("/notifications/rejected")
    assert "No notification has been rejected." in page.text


def test_rejected_notifications_are_listed_whole_apart_from_telemetry(
    console: TestClient, engine: sa.Engine
) -> None:
    subject = "Pump 3 " + "s" * 300
    with begin_write(engine) as conn:
        keep_rejected(
            conn,
            "site:plant-7",
            {"subject": subject},
            "subject: 307 characters; at most 256",
            now=datetime.now(UTC),
        )
    console.post("/signin", data={"token": OPERATOR})
    page = console.get("/notifications/rejected")
    assert page.status_code == 200
    assert "notification:site:plant-7" in page.text and subject in page.text
    assert "subject: 307 characters; at most 256" in page.text
    assert "Re-submit" not in page.text  # a notification is no telemetry
    telemetry = console.get("/site-calls/rejected")
    assert "plant-7" not in telemetry.text and "No telemetry has been rejected." in telemetry.text


def test_the_list_filters_by_created_time_from_inclusive_to_exclusive(
    console: TestClient, engine: sa.Engine
) -> None:
    console.post("/signin", data={"token": READER})
    put(engine, at=NOW, subject="at eight")
    put(engine, at=NOW + timedelta(hours=1), subject="at nine")
    put(engine, at=NOW + timedelta(hours=2), subject="at ten")
    page = console.get(
        "/notifications", params={"from": "2025-06-01T09:00", "to": "2025-06-01T10:00"}
    )
    assert page.status_code == 200
    assert "at nine" in page.text and "at eight" not in page.text and "at ten" not in page.text
    assert 'name="from" value="2025-06-01T09:00"' in page.text
    assert console.get("/notifications", params={"from": "yesterday"}).status_code == 400


def trend(page: str, metric: str) -> str:
    """The figure of one notification KPI's trend chart on ``page``."""
    return page.split(f'data-testid="notification-trend-{metric}"')[1].split("</figure>")[0]


def test_the_trends_are_drawn_from_the_kpi_history_on_the_page_and_the_dashboard(
    console: TestClient, engine: sa.Engine
) -> None:
    now = datetime.now(UTC)
    settings = Settings(database_url=str(engine.url))
    put(engine, at=now - timedelta(hours=2))
    take_sample(engine, settings, now - timedelta(hours=1))
    put(engine, at=now - timedelta(hours=2), subject="second")
    put(engine, status="Pending", at=now - timedelta(minutes=50), channel="Email", target="x")
    take_sample(engine, settings, now - timedelta(minutes=30))
    console.post("/signin", data={"token": READER})

    for path in ("/notifications", "/"):
        page = console.get(path)
        assert page.status_code == 200, page.text
        parked = trend(page.text, "parked")
        assert "Latest: 2 notifications at" in parked and "<polyline" in parked
        assert parked.count('<circle class="dot"') == 2  # one point per sample
        buffered = trend(page.text, "buffered")
        assert "Latest: 1 notification at" in buffered
        # the chart names its figure as the tile does
        assert "<strong>To send</strong>" in buffered
        failed = trend(page.text, "failed_last_interval")
        assert "<strong>Failed in the last 1 h</strong>" in failed
        assert "interval" not in failed.split("</strong>")[0]
        age = trend(page.text, "oldest_pending_age_seconds")
        assert age.count('<circle class="dot"') == 1  # nothing pending at the first sample
        for metric in ("failed_last_interval", "delivered_last_interval", "stuck"):
            assert f'data-testid="notification-trend-{metric}"' in page.text
    assert 'data-testid="trend-parked"' in console.get("/").text  # the site calls' still

    email = console.get("/notifications", params={"scope_channel": "Email"})
    assert "Latest: 0 notifications at" in trend(email.text, "parked")
    assert "Latest: 1 notification at" in trend(email.text, "buffered")
    assert 'href="/notifications?status=Parked&amp;channel=Email"' in email.text
    refused = console.get("/notifications", params={"scope_channel": "Pigeon"})
    assert refused.status_code == 400 and "scope_channel" in refused.text


SLACK_URL = "https://hooks.slack.com/services/T0000000/B0000000/XXXXsecretpathXXXX"
CREDENTIALED_URL = "http://deploy:hunter2pass@hooks.local:8443/x"


@pytest.fixture
def configured(tmp_path: Path, database_url: str, engine: sa.Engine) -> Iterator[TestClient]:
    """A console whose outbox has secret-bearing webhook URLs, a recipient list and rules."""
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        auth_tokens=[AuthToken(name="rita", token=READER, role="reader")],
        sites=[{"id": "plant-7", "base_url": "http://127.0.0.1:9"}],
        notifications={
            "smtp": {"host": "mail.local", "sender": "cr@example.org"},
            "recipient_lists": [{"name": "oncall", "addresses": ["a@example.org", "b@x.org"]}],
            "webhooks": [
                {"name": "chat", "url": SLACK_URL, "secret": SECRET, "format": "slack"},
                {"name": "pager", "url": CREDENTIALED_URL, "secret": SECRET},
            ],
            "rules": [
                {
                    "name": "plant-7-down",
                    "event_types": ["SiteUnreachable", "SitePinned"],
                    "site": "plant-7",
                    "min_severity": "warning",
                    "channel": "Webhook",
                    "target": "chat",
                    "severity": "Critical",
                    "window": "PT15M",
                },
                {
                    "name": "given-up",
                    "event_types": ["RetryBatchGivenUp"],
                    "endpoint": "Sales",
                    "channel": "Email",
                    "target": "oncall",
                },
            ],
        },
    )
    app = create_app(settings, engine, FileSystemBodyStore(tmp_path / "bodies"))
    with TestClient(app, follow_redirects=False) as client:
        client.post("/signin", data={"token": READER})
        yield client


def rule_rows(page: str) -> list[str]:
    table = page.split('data-testid="rules"', 1)[1].split("</table>", 1)[0]
    return [
        re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip()
        for row in table.split("<tbody>", 1)[1].split("</tr>")[:-1]
    ]


def test_the_rules_configured_are_listed_with_their_filters(configured: TestClient) -> None:
    page = configured.get("/notifications").text
    assert rule_rows(page) == [
        "plant-7-down SiteUnreachable, SitePinned site plant-7; at least warning Webhook chat "
        "15 min Critical",
        "given-up RetryBatchGivenUp endpoint Sales Email oncall 5 min Warning",
    ]


def test_a_webhook_is_shown_by_its_origin_never_its_path_or_credentials(
    configured: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        page = configured.get("/notifications").text
        bearer = {"Authorization": f"Bearer {READER}"}
        answers = [
            configured.get(path, headers=bearer).text
            for path in ("/api/configuration", "/api/notifications", "/api/notifications/kpis")
        ]
    assert "https://hooks.slack.com" in page and "http://hooks.local:8443" in page
    for shown in (page, *answers, caplog.text):
        for secret in ("services/T0000000", "secretpath", "hunter2pass", "deploy:", "whsec_"):
            assert secret not in shown


def test_a_notifications_page_says_each_recipients_outcome_and_the_latest_attempt(
    configured: TestClient, engine: sa.Engine
) -> None:
    notification_id = put(engine, status="Retrying", channel="Email", target="oncall")
    later = NOW + timedelta(minutes=3)
    with begin_write(engine) as conn:
        conn.execute(
            sa.update(notifications)
            .where(notifications.c.notification_id == notification_id)
            .values(
                retry_count=2,
                reply_code=450,
                last_error="SMTP refused {'b@x.org': (450, 'greylisted')}",
                delivered_to=json.dumps(["a@example.org"]),
                updated_at_utc=later,
                next_attempt_at_utc=later + timedelta(minutes=1),
            )
        )
    page = configured.get(f"/notifications/{notification_id}").text
    assert 'data-testid="retry-count">2<' in page and 'data-testid="reply-code">450<' in page
    assert "greylisted" in page
    outcomes = page.split('data-testid="recipient-outcomes"', 1)[1].split("</ul>", 1)[0]
    said = re.sub(r"<[^>]+>", "", outcomes)
    assert "a@example.org: delivered" in said and "b@x.org: not delivered" in said
    for stamp in (NOW, later, later + timedelta(minutes=1)):
        assert stamp.strftime("%Y-%m-%d %H:%M") in page
    detail = configured.get(
        f"/api/notifications/{notification_id}", headers={"Authorization": f"Bearer {READER}"}
    ).json()
    assert detail["delivered_to"] == ["a@example.org"] and detail["retry_count"] == 2
