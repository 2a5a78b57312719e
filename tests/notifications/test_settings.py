"""notifications.* settings: defaults, and a bad channel refused at start naming it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from controlroom.config import Settings

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
