"""notifications.* settings: defaults, and a bad channel or rule refused at start naming
it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import ValidationError

from controlroom.config import Settings
from controlroom.event_types import EventType
from controlroom.events import record_event

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_defaults_follow_the_design() -> None:
    outbox = Settings().notifications
    assert outbox.max_attempts == 10
    assert outbox.backoff_cap == timedelta(minutes=15)
    assert outbox.retention_days == 365
    assert outbox.smtp is None and outbox.webhooks == []


@pytest.mark.parametrize(
    ("notifications", "where"),
    [
        ({"webhooks": [{"name": "ops", "url": "http://h/x", "secret": "plain"}]}, "secret"),
        ({"webhooks": [{"name": "ops", "url": "ftp://h/x", "secret": SECRET}]}, "url"),
        ({"webhooks": [{"name": "a\r\nb", "url": "http://h/x", "secret": SECRET}]}, "name"),
        (
            {
                "smtp": {"host": "mail"},
                "recipient_lists": [{"name": "ops", "addresses": ["a@b\r\nBcc: c@d"]}],
            },
            "addresses",
        ),
        ({"recipient_lists": [{"name": "ops", "addresses": ["a@b.c"]}]}, "notifications"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"smtp": {"host": "mail", "starttls": True, "tls": True}}, "smtp"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(notifications: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(notifications=notifications)
    assert where in str(refused.value)
    assert "whsec_MfKQ" not in str(refused.value)


HOOK = {"name": "ops", "url": "http://h/x", "secret": SECRET}
RULE = {"name": "r", "event_types": ["FailureGroupAppeared"], "channel": "Webhook", "target": "ops"}


@pytest.mark.parametrize(
    ("notifications", "where"),
    [
        # Past these a stamp computed from the setting leaves the calendar (year 9999):
        # the write path or the dispatcher would fail on it, not the start.
        ({"webhooks": [HOOK], "rules": [{**RULE, "window": "P3000000D"}]}, "rules.0.window"),
        ({"webhooks": [HOOK], "rules": [{**RULE, "window": "P8D"}]}, "rules.0.window"),
        ({"backoff_base": "P2D"}, "backoff_base"),
        ({"backoff_cap": "P3000000D"}, "backoff_cap"),
        ({"retry_after_cap": "P3000000D"}, "retry_after_cap"),
        ({"retention_days": 3_000_000}, "retention_days"),
        ({"claim_seconds": 1e12}, "claim_seconds"),
    ],
)
def test_a_duration_past_its_bound_is_refused_naming_it(
    notifications: dict[str, Any], where: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(notifications=notifications)
    assert where in str(refused.value)


def test_a_week_long_window_is_a_rule_of_its_own() -> None:
    rule = {**RULE, "window": "P7D"}
    outbox = Settings(notifications={"webhooks": [HOOK], "rules": [rule]}).notifications
    assert outbox.rules[0].window == timedelta(days=7)


@pytest.mark.parametrize(
    ("notifications", "said"),
    [
        (
            {"recipient_lists": [{"name": "ops", "addresses": ["a@b.c"]}]},
            "recipient_lists need an smtp server (notifications.smtp)",
        ),
        (
            {"webhooks": [HOOK], "rules": [{**RULE, "target": "zz"}]},
            "rules: rule 'r' names Webhook target 'zz', which is not configured "
            "(notifications.webhooks names: ops)",
        ),
        (
            {"rules": [{**RULE, "channel": "Email", "target": "zz"}]},
            "rules: rule 'r' names Email target 'zz', which is not configured "
            "(notifications.recipient_lists names: none)",
        ),
    ],
)
def test_a_channel_a_setting_needs_is_named_where_it_is_configured(
    notifications: dict[str, Any], said: str
) -> None:
    """Fresh-user pass (sixth): the refusals did not say where the smtp server or a
    webhook is configured."""
    with pytest.raises(ValidationError) as refused:
        Settings(notifications=notifications)
    assert said in str(refused.value)


def test_two_webhooks_of_one_name_are_refused() -> None:
    hook = {"name": "ops", "url": "http://h/x", "secret": SECRET}
    with pytest.raises(ValidationError, match="share a name"):
        Settings(notifications={"webhooks": [hook, hook]})


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTROLROOM_NOTIFICATIONS__MAX_ATTEMPTS", "4")
    monkeypatch.setenv(
        "CONTROLROOM_NOTIFICATIONS__WEBHOOKS",
        f'[{{"name": "ops", "url": "http://h/x", "secret": "{SECRET}"}}]',
    )
    outbox = Settings().notifications
    assert outbox.max_attempts == 4
    hook = outbox.webhook("ops")
    assert hook is not None and SECRET not in repr(hook)


def rule(**overrides: Any) -> dict[str, Any]:
    return {
        "name": "watch",
        "event_types": ["IntakeStalled"],
        "channel": "Webhook",
        "target": "ops",
        **overrides,
    }


def with_rule(**overrides: Any) -> dict[str, Any]:
    hook = {"name": "ops", "url": "http://h/x", "secret": SECRET}
    return {"webhooks": [hook], "rules": [rule(**overrides)]}


def test_a_misspelt_event_type_is_refused_naming_the_rule_and_the_closest_kind() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(notifications=with_rule(event_types=["RetryBatchGivenUp", "IntakeStaled"]))
    text = str(refused.value)
    assert "rules[0].event_types" in text and "'IntakeStaled'" in text
    assert "did you mean 'IntakeStalled'" in text


def test_every_event_type_a_writer_uses_is_one_a_rule_may_name() -> None:
    """The rules are checked against the list the writers take their kinds from
    (``events.record_event`` refuses any other)."""
    kinds = [str(kind) for kind in EventType]
    assert Settings(notifications=with_rule(event_types=kinds)).notifications.rules


def test_the_event_log_refuses_a_kind_not_in_the_list(engine: sa.Engine) -> None:
    with pytest.raises(ValueError), engine.begin() as conn:
        record_event(
            conn,
            description="x",
            severity="info",
            category="Test",
            event_type="IntakeStaled",  # type: ignore[arg-type]
            raised_at=datetime(2026, 1, 1, tzinfo=UTC),
        )


def test_a_site_filter_naming_an_unconfigured_site_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(notifications=with_rule(event_types=["SiteUnreachable"], site="plant-7"))
    text = str(refused.value)
    assert "notifications.rules[0].site" in text and "'plant-7'" in text
    site = {"id": "plant-7", "base_url": "http://127.0.0.1:9"}
    configured = Settings(
        sites=[site], notifications=with_rule(event_types=["SiteUnreachable"], site="plant-7")
    )
    assert configured.notifications.rules[0].site == "plant-7"
