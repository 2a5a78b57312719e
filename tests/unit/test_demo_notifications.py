"""The notification demo's settings and webhook sink: ports that follow central's, settings
central accepts, and a sink that refuses the pager (so its notifications park)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from controlroom.config import NotificationSettings
from controlroom.demo_notifications import demo_notification_settings, sink_ports, webhook_app


def test_the_sinks_ports_follow_central_and_miss_the_site_demos() -> None:
    assert sink_ports(8080) == (8094, 8095)
    assert sink_ports(9300) == (9314, 9315)
    assert sink_ports(65530) == (65515, 65516)
    assert sink_ports(0) == (8094, 8095)


def test_central_accepts_the_demo_settings_pointing_at_the_sinks() -> None:
    outbox = NotificationSettings.model_validate(demo_notification_settings(9300))
    assert outbox.smtp is not None and outbox.smtp.port == 9315
    assert {hook.name: (hook.url, hook.format) for hook in outbox.webhooks} == {
        "ops-chat": ("http://127.0.0.1:9314/ops-chat", "slack"),
        "pager": ("http://127.0.0.1:9314/pager", "standard"),
    }
    assert {rule.target for rule in outbox.rules} == {"oncall", "ops-chat", "pager"}


def test_the_webhook_sink_accepts_ops_chat_and_refuses_the_pager() -> None:
    said: list[str] = []
    with TestClient(webhook_app(said.append)) as client:
        assert client.post("/ops-chat", json={"text": "*hi*\nmore"}).status_code == 204
        assert client.post("/pager", json={"subject": "down"}).status_code == 500
    assert said == [
        "webhook ops-chat: None '*hi*' (accepted)",
        "webhook pager: None 'down' (refused, 500)",
    ]


def test_the_demos_finished_retries_are_news_and_its_failed_imports_errors() -> None:
    outbox = NotificationSettings.model_validate(demo_notification_settings(9300))
    severities = {rule.name: str(rule.severity) for rule in outbox.rules}
    assert severities["retries-chat"] == "Info"
    assert {severities[name] for name in severities if name.startswith("failed-imports")} == {
        "Error"
    }
